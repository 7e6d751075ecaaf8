package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/oaiwire"
	"github.com/parley-chat/parley/web/internal/wsock"
)

// The Responses API's WebSocket mode: GET /v1/responses upgrades, and each
// text message the client sends is a "response.create" event whose fields
// are POST /v1/responses's (stream is implied). The server answers with the
// same events as the streamed HTTP form, one JSON text message each, and
// runs the requests of one socket one after the other. Its sessions are the
// HTTP API's and the chat WebSocket's: previous_response_id and
// conversation continue any of them. The socket also keeps the newest
// store: false response in memory, so unstored responses chain on it (as
// OpenAI's WebSocket mode does); closing the socket forgets it. A
// response.create with generate: false is a warm-up (see warmup). Errors are an "error" event
// ({"type": "error", "status": 400, "error": {code, message, param}}); the
// socket stays open for the next request.

// respSocket is one Responses API WebSocket, tracked like the chat's
// connections so Close waits for its running response and then closes it
// with 1001 (Shutdown does not close hijacked connections); the handler's
// read then fails and it returns. It runs on the pump the chat's
// connections run on.
type respSocket struct {
	*wsock.Pump
	srv   *API
	facts apicore.Facts // its upgrade request's (apicore.FactsOf): every response's on it
	caps  wsock.Caps    // the sizes of its messages (messageCaps)
	busy  atomic.Bool   // a response is running on it
}

// messageCaps are the sizes of a socket's messages: a message holds what a
// POST body may (apicore.MaxBodyBytes), and as much more as its images may
// take as data: URLs under the image limits. Its bytes past the server's
// --max-message-bytes are held from the budget of request bodies in
// flight until its response ends, as an HTTP body's are.
func (s *API) messageCaps() wsock.Caps {
	return wsock.Caps{Plain: apicore.MaxBodyBytes, Max: apicore.MaxBodyBytes + s.core.ImagePolicy.Limits.MaxSourceBytes(),
		Free: s.sockets.Settings().MaxMessageBytes}
}

func (r *respSocket) Replying() bool { return r.busy.Load() }

// errSocketClosed is what a response's writes return once its socket has
// closed (or its client stopped reading).
var errSocketClosed = errors.New("responses websocket closed")

// ResponsesWS is GET /v1/responses.
func (s *API) ResponsesWS(c echo.Context) error {
	r, w := c.Request(), c.Response()
	facts := apicore.FactsOf(c)
	if !websocket.IsWebSocketUpgrade(r) {
		return parley.Errorf(parley.EInvalid, "GET /v1/responses is the WebSocket mode: upgrade, or POST to create a response")
	}
	// The API group's middleware has checked the API key.
	ip, err := s.sockets.Accept(r, false)
	if err != nil {
		return err
	}
	defer s.sockets.Release(ip)
	// The connection is its conversations' affinity while it lasts: the
	// upgrade names only a key the client sent, for its next connection.
	var hdr http.Header
	if sent := r.Header.Get(parley.AffinityHeader); sent != "" {
		hdr = http.Header{parley.AffinityHeader: {parley.AffinityKey(facts.Caller.User, sent, nil)}}
	}
	caps := s.messageCaps()
	ws, ok := s.sockets.Upgrade(w, r, hdr, caps.ReadLimit())
	if !ok {
		return nil // the upgrader has answered
	}
	sock := &respSocket{srv: s, facts: facts, caps: caps, Pump: wsock.NewPump(s.sockets.Settings(), r.Context(), ws, caps.ReadLimit(), s.core.Log.With(zap.String("remote", ip)))}
	if !s.sockets.TrackOrRefuse(sock, ws) {
		sock.Cancel()
		return nil
	}
	defer s.sockets.Untrack(sock)

	writerDone := sock.StartWriter()
	sock.reader()
	sock.Close(websocket.CloseNormalClosure, "")
	sock.Finish(writerDone)
	return nil
}

// warmup is a response.create with generate: false (Codex sends one
// when it opens the socket): nothing is generated; the answer is a
// completed response with no output whose id the next request may chain
// from, as from any response, with only its new input. The socket keeps
// the warm-up's request and prepends its input to that next request's.
type warmup struct {
	id  string // warmupPrefix and a random part
	req session.ResponseRequest
}

// warmupPrefix starts a warm-up's response id.
const warmupPrefix = "resp_warmup_"

// chain makes a request that continues the warm-up into one that carries
// the warm-up's input before its own (and its instructions, when it sends
// none), held to the warm-up's cap on the whole prompt, if it had one (a
// warm-up is answered without a count: see parseResponsesRequest).
func (w *warmup) chain(req *session.ResponseRequest) {
	if w == nil || req.Previous != w.id {
		return
	}
	req.Previous = ""
	req.MaxPromptTokens = max(req.MaxPromptTokens, w.req.MaxPromptTokens)
	req.Input = append(append([]parley.Message(nil), w.req.Input...), req.Input...)
	if req.Instructions == nil {
		req.Instructions = w.req.Instructions
	}
}

// answerWarmup answers a warm-up: response.created and response.completed
// of a response with no output.
func (s *API) answerWarmup(pr *parsedResponse, write func([]byte) error) (*warmup, error) {
	id := warmupPrefix + fmt.Sprintf("%016x%08x", rand.Uint64(), rand.Uint32())
	rec := session.ResponseRecord{ID: id, Created: time.Now().Unix(), Status: session.StatusCompleted, Temperature: pr.req.Params.Temperature, TopP: pr.req.Params.TopP}
	if pr.req.Instructions != nil {
		rec.Instructions = *pr.req.Instructions
	}
	o := s.newResponseObject(rec, "", false, pr.facts.Model)
	setUsage(o, rec)
	es := &eventStream{emit: func(_ string, b []byte) error { return write(b) }}
	err := steps(
		func() error { return es.send("response.created", map[string]any{"response": o}) },
		func() error { return es.send("response.completed", map[string]any{"response": o}) },
	)
	return &warmup{id: id, req: pr.req}, err
}

// reader runs the socket's requests, one after the other, until the
// client leaves or the socket closes.
func (sock *respSocket) reader() {
	write := func(b []byte) error {
		if !sock.SendWait(b) {
			return errSocketClosed
		}
		return nil
	}
	// local is the newest store: false response's session: the socket's own
	// state, so unstored responses chain by previous_response_id here.
	var local *session.Session
	var warm *warmup // the socket's last warm-up
	bodies := sock.srv.sockets.Settings().Bodies
	sock.StartReadDeadline()
	for {
		mt, data, hold, refusal, ok := sock.ReadMessage(sock.caps, bodies, sock.facts.Caller.Client)
		if !ok {
			return // the client left or broke the protocol; nothing to answer
		}
		if refusal == nil && mt != websocket.TextMessage {
			refusal = parley.Errorf(parley.EInvalid, "send response.create events as text messages")
		}
		if refusal != nil {
			hold.Release()
			if write(wsErrorEvent(refusal)) != nil {
				return
			}
			continue
		}
		sock.busy.Store(true)
		err := sock.wsResponse(data, write, &local, &warm)
		sock.busy.Store(false)
		hold.Release() // the message is done with, as an HTTP body is when its handler returns
		if err != nil {
			sock.Log.Debug("responses websocket ended", zap.Error(err))
			return
		}
		// Nothing is read while a response runs, so the pongs that would
		// have moved the read deadline wait unread: a response longer than
		// the pong wait would leave it passed. The peer was alive all along
		// (it took every event within the write wait): give it a full pong
		// wait from here.
		sock.ExtendReadDeadline()
	}
}

// wsResponse runs one response.create event, the message data. It returns
// an error only when the socket failed.
func (sock *respSocket) wsResponse(data []byte, write func([]byte) error, local **session.Session, warm **warmup) error {
	s, ctx := sock.srv, sock.Ctx
	refuse := func(err error) error { return write(wsErrorEvent(err)) }
	if err := s.core.Available(); err != nil {
		return refuse(err)
	}
	checkRest := func(imageBytes int64) error { return sock.CheckRest(sock.caps, int64(len(data)), imageBytes) }
	pr, err := s.parseRequest(ctx, sock.facts, data, checkRest)
	if err != nil {
		return refuse(err)
	}
	if pr.typ != "response.create" {
		return refuse(parley.FieldErrorf("type", "must be response.create, got %q", pr.typ))
	}
	if pr.bg {
		return refuse(parley.FieldErrorf("background", "is for HTTP requests: a response on this socket streams on it"))
	}
	(*warm).chain(&pr.req)
	if pr.warmup {
		w, err := s.answerWarmup(pr, write)
		*warm = w
		s.core.Log.Debug("responses websocket warm-up", zap.String("id", w.id), zap.Int("input_items", len(pr.req.Input)))
		return err
	}
	if l := *local; l != nil && pr.req.Previous != "" {
		if _, ok := l.Record(pr.req.Previous); ok {
			pr.req.Local = l
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := s.prepareMCP(ctx, pr); err != nil {
		return refuse(err)
	}
	resp, err := s.respond(ctx, pr.facts.Caller, pr.req)
	if err != nil {
		return refuse(pr.renameSent(err))
	}
	emit := func(_ string, b []byte) error { return write(b) }
	if pr.mcp != nil {
		_, err = s.respondMCP(ctx, cancel, resp, pr, emit)
	} else {
		err = s.streamResponse(ctx, cancel, resp, pr, emit)
	}
	if l := resp.Local(); l != nil {
		*local = l
	}
	return err
}

func wsErrorEvent(err error) []byte {
	b, _ := json.Marshal(struct {
		Type       string        `json:"type"`
		Status     int           `json:"status"`
		Error      oaiwire.Error `json:"error"`
		RetryAfter int           `json:"retry_after,omitempty"` // seconds, as the HTTP Retry-After header says it
	}{"error", oaiwire.Status(err), oaiwire.NewError(err), apicore.RetryAfterSeconds(err)})
	return b
}
