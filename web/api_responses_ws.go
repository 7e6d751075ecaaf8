package web

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"

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
// read then fails and it returns. It runs on the pump the chat's
// connections run on.
type respSocket struct {
	pump
	busy atomic.Bool // a response is running on it
}

func (r *respSocket) replying() bool { return r.busy.Load() }

// errSocketClosed is what a response's writes return once its socket has
// closed (or its client stopped reading).
var errSocketClosed = errors.New("responses websocket closed")

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
	sock := &respSocket{pump: s.newPump(r.Context(), ws, maxAPIBodyBytes, s.log.With(zap.String("remote", ip)))}
	if !s.trackOrRefuse(sock, ws) {
		sock.cancel()
		return nil
	}
	defer s.untrack(sock)

	writerDone := sock.startWriter()
	sock.reader()
	sock.close(websocket.CloseNormalClosure, "")
	sock.finish(writerDone)
	return nil
}

// reader runs the socket's requests, one after the other, until the
// client leaves or the socket closes.
func (sock *respSocket) reader() {
	write := func(b []byte) error {
		if !sock.sendWait(b) {
			return errSocketClosed
		}
		return nil
	}
	// local is the newest store: false response's session: the socket's own
	// state, so unstored responses chain by previous_response_id here.
	var local *session.Session
	sock.rd.start()
	for {
		mt, data, ok := sock.read()
		if !ok {
			return // the client left or broke the protocol; nothing to answer
		}
		if mt != websocket.TextMessage {
			if write(wsErrorEvent(parley.Errorf(parley.EInvalid, "send response.create events as text messages"))) != nil {
				return
			}
			continue
		}
		sock.busy.Store(true)
		err := sock.srv.wsResponse(sock.ctx, data, write, &local)
		sock.busy.Store(false)
		if err != nil {
			sock.log.Debug("responses websocket ended", zap.Error(err))
			return
		}
		// Nothing is read while a response runs, so the pongs that would
		// have moved the read deadline wait unread: a response longer than
		// the pong wait would leave it passed. The peer was alive all along
		// (it took every event within the write wait): give it a full pong
		// wait from here.
		sock.rd.extend()
	}
}

// wsResponse runs one response.create event. It returns an error only when
// the socket failed.
func (s *Server) wsResponse(ctx context.Context, data []byte, write func([]byte) error, local **session.Session) error {
	refuse := func(err error) error { return write(wsErrorEvent(err)) }
	if err := s.apiAvailable(); err != nil {
		return refuse(err)
	}
	pr, err := s.parseResponsesRequest(ctx, data)
	if err != nil {
		return refuse(err)
	}
	if pr.typ != "response.create" {
		return refuse(parley.FieldErrorf("type", "must be response.create, got %q", pr.typ))
	}
	if pr.bg {
		return refuse(parley.FieldErrorf("background", "is for HTTP requests: a response on this socket streams on it"))
	}
	ctx, cancel := context.WithCancel(withModel(ctx, pr.model))
	defer cancel()
	if l := *local; l != nil && pr.req.Previous != "" {
		if _, ok := l.Record(pr.req.Previous); ok {
			pr.req.Local = l
		}
	}
	resp, err := s.respond(ctx, pr.req)
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
	}{"error", wireStatus(err, shapeOpenAI), newOpenAIError(err), retryAfterSeconds(err)})
	return b
}
