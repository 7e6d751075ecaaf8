package web

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// The Responses API's WebSocket mode: GET /v1/responses upgrades, and each
// text message the client sends is a "response.create" event whose fields
// are POST /v1/responses's (stream is implied). The server answers with the
// same events as the streamed HTTP form, one JSON text message each, and
// runs the requests of one socket one after the other. Its sessions are the
// HTTP API's and the chat WebSocket's: previous_response_id and
// conversation continue any of them. The socket also keeps the newest
// store: false response in memory, so unstored responses chain on it (as
// OpenAI's WebSocket mode does); closing the socket forgets it. Errors are an "error" event
// ({"type": "error", "status": 400, "error": {code, message, param}}); the
// socket stays open for the next request.

// respSocket is one Responses API WebSocket, tracked like the chat's
// connections so Close waits for its running response and then closes it
// with 1001 (Shutdown does not close hijacked connections); the handler's
// read then fails and it returns.
type respSocket struct {
	ws       *websocket.Conn
	busy     atomic.Bool // a response is running on it
	writeDue time.Duration
}

func (r *respSocket) replying() bool { return r.busy.Load() }

func (r *respSocket) close(code int, text string) {
	_ = writeClose(r.ws, code, text, r.writeDue)
	r.ws.Close()
}

// handleResponsesWS is GET /v1/responses.
func (s *Server) handleResponsesWS(c echo.Context) error {
	r, w := c.Request(), c.Response()
	if !websocket.IsWebSocketUpgrade(r) {
		return parley.Errorf(parley.EInvalid, "GET /v1/responses is the WebSocket mode: upgrade, or POST to create a response")
	}
	// The API group's middleware has checked the API key.
	ip, err := s.accept(r, false)
	if err != nil {
		return err
	}
	defer s.releaseIP(ip)
	ws, ok := s.upgrade(w, r, nil, maxAPIBodyBytes)
	if !ok {
		return nil // the upgrader has answered
	}
	defer ws.Close()
	sock := &respSocket{ws: ws, writeDue: s.cfg.WriteWait}
	if !s.trackOrRefuse(sock, ws) {
		return nil
	}
	defer s.untrack(sock)

	rd := &readDeadline{ws: ws, pongWait: s.cfg.PongWait}
	rd.start()
	// The pinger keeps an idle client's read deadline moving; WriteControl
	// may run concurrently with the handler's writes (gorilla allows it).
	stop := make(chan struct{})
	var pinger sync.WaitGroup
	pinger.Add(1)
	go func() {
		defer pinger.Done()
		t := time.NewTicker(s.pingPeriod())
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if ping(ws, s.cfg.WriteWait) != nil {
					return
				}
			}
		}
	}()
	defer pinger.Wait()
	defer close(stop)

	write := func(b []byte) error {
		_ = ws.SetWriteDeadline(time.Now().Add(s.cfg.WriteWait))
		return ws.WriteMessage(websocket.TextMessage, b)
	}
	ctx := r.Context()
	// local is the newest store: false response's session: the socket's own
	// state, so unstored responses chain by previous_response_id here.
	var local *session.Session
	for {
		mt, data, err := ws.ReadMessage()
		if err != nil {
			return nil // the client left or broke the protocol; nothing to answer
		}
		rd.extend()
		if mt != websocket.TextMessage {
			if write(wsErrorEvent(parley.Errorf(parley.EInvalid, "send response.create events as text messages"))) != nil {
				return nil
			}
			continue
		}
		sock.busy.Store(true)
		err = s.wsResponse(ctx, data, write, &local)
		sock.busy.Store(false)
		if err != nil {
			s.log.Debug("responses websocket ended", zap.Error(err))
			return nil
		}
	}
}

// wsResponse runs one response.create event. It returns an error only when
// the socket failed.
func (s *Server) wsResponse(ctx context.Context, data []byte, write func([]byte) error, local **session.Session) error {
	refuse := func(err error) error { return write(wsErrorEvent(err)) }
	if err := s.apiAvailable(); err != nil {
		return refuse(err)
	}
	pr, err := s.parseResponsesRequest(data)
	if err != nil {
		return refuse(err)
	}
	if pr.typ != "response.create" {
		return refuse(parley.FieldErrorf("type", "must be response.create, got %q", pr.typ))
	}
	if pr.bg {
		return refuse(parley.FieldErrorf("background", "is for HTTP requests: a response on this socket streams on it"))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if l := *local; l != nil && pr.req.Previous != "" {
		if _, ok := l.Record(pr.req.Previous); ok {
			pr.req.Local = l
		}
	}
	resp, err := s.api.convs.Respond(ctx, pr.req)
	if err != nil {
		return refuse(pr.renameSent(err))
	}
	err = s.streamResponse(ctx, cancel, resp, pr, func(_ string, b []byte) error { return write(b) })
	if l := resp.Local(); l != nil {
		*local = l
	}
	return err
}

func wsErrorEvent(err error) []byte {
	b, _ := json.Marshal(struct {
		Type       string      `json:"type"`
		Status     int         `json:"status"`
		Error      openAIError `json:"error"`
		RetryAfter int         `json:"retry_after,omitempty"` // seconds, as the HTTP Retry-After header says it
	}{"error", ErrorStatus(err), newOpenAIError(err), retryAfterSeconds(err)})
	return b
}
