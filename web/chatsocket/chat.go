// Package chatsocket serves the chat WebSocket (/ws, and / for an upgrade):
// one socket per session, the page's JSON mode and a plain text mode, one
// reader, one writer and one worker per connection that runs the session's
// turns in order. A reply outlives a dropped socket for ResumeGrace, its
// tokens kept, so a client that comes back with the session's id follows
// it from where it left off (resume.go).
package chatsocket

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/wsock"
)

// WebSocket timing and sizes. The invariants follow gorilla's examples;
// the pong wait, write wait, send buffer and queue bound are in Config.
const (
	// SubprotocolJSON selects the JSON mode (the page's).
	SubprotocolJSON = "parley.v1+json"
)

// conn is one WebSocket connection: one reader (the handler goroutine), one
// writer, and one worker that runs the session's turns in order.
type conn struct {
	*wsock.Pump // the socket's writer, reader and close
	srv         *Chat

	ip   string
	user string // the user the socket acts for (apicore.Facts.Caller): only its sessions are reached
	json bool
	// thinking: text mode shows a reasoning model's thought (?thinking=show), marked; JSON mode always sends it
	// as thinking messages.
	thinking bool
	id       string // session id
	// model is the session's model, with several models ("" with one):
	// the worker sets it (a prompt that picks it), the reader reads it.
	model atomic.Pointer[string]

	inbox *inbox // prompts, control messages and queued answers for the worker, in arrival order

	busy       atomic.Bool // a turn is running
	turnMu     sync.Mutex
	turnCancel context.CancelFunc // cancels the running turn; guarded by turnMu; a child of ctx, so close ends it too

	limiter *rateLimiter
	hold    *admission // the client's admission, which its replies hold too
}

type jobKind int

const (
	jobPrompt jobKind = iota
	jobReset
	jobSystem
	jobAnswer // an error that answers a message which was not queued (see inbox)
)

type job struct {
	kind    jobKind
	content string
	images  []parley.ImagePart // jobPrompt: the prompt's images
	callID  string             // jobPrompt: the tool call content answers ("" for a user's prompt)
	regen   bool               // jobPrompt: regenerate the last reply (content is empty)
	cont    bool               // jobPrompt: continue the last reply (content is empty)
	model   string             // jobPrompt: the model the prompt names ("" = the session's)
	params  parley.Params
	server  *toolloop.Selection // jobPrompt: the tools that run on the server (nil: none)
	err     error               // jobAnswer: what to tell the client
	n       int                 // jobAnswer: how many messages it answers (equal answers in a row are merged)
}

func (s *Chat) Handle(c echo.Context) error {
	r, w := c.Request(), c.Response()
	ip, err := s.sockets.Accept(r, true)
	if err != nil {
		return err
	}
	// The socket holds the admission, and so does every reply it starts
	// until that reply ends (a reply may outlive the socket).
	hold := newAdmission(func() { s.sockets.Release(ip) })
	defer hold.done()

	jsonMode, resumeFrom, err := socketMode(r)
	if err != nil {
		return err
	}
	who := apicore.FactsOf(c).Caller
	user := who.User
	// ?model= picks a new session's model (with several models; an
	// unknown one is a 404 before the upgrade). A resumed session keeps
	// the model it was started with.
	model, err := s.core.ResolveModel(r.URL.Query().Get("model"))
	if err != nil {
		return err
	}
	sess, resumed, err := s.sessions.OpenModel(r.Context(), who, r.URL.Query().Get("session"), model)
	if err != nil && !answerOnSocket(err) {
		return err
	}
	hdr := http.Header{}
	if sess != nil {
		hdr.Set("X-Parley-Session", sess.ID)
	}
	readLimit := s.cfg.MaxMessageBytes
	if jsonMode && s.cfg.MaxImageMessageBytes > readLimit {
		// Past its cap a message is read to its end and dropped (conn.read);
		// one twice as long closes the connection, as a text one past its
		// cap does.
		readLimit = 2 * s.cfg.MaxImageMessageBytes
	}
	ws, ok := s.sockets.Upgrade(w, r, hdr, readLimit)
	if !ok {
		return nil // the upgrader has written the response
	}

	// The connection outlives the upgrade request: its own context, a child
	// of the server's stop context, which names the client like the request's
	// (a session the connection writes first is the client's).
	cn := &conn{
		srv:      s,
		Pump:     wsock.NewPump(s.sockets.Settings(), s.stop, ws, s.cfg.MaxMessageBytes, s.log.With(zap.String("remote", ip))),
		ip:       ip,
		user:     user,
		json:     jsonMode,
		thinking: showThinking(r.URL.Query().Get("thinking")),
		inbox:    newInbox(s.cfg.MaxQueuedPrompts),
		hold:     hold,
		limiter:  newRateLimiter(s.cfg.PromptsPerMinute, time.Minute),
	}
	if !s.sockets.TrackOrRefuse(cn, ws) {
		cn.Cancel()
		return nil
	}
	defer s.sockets.Untrack(cn)

	writerDone := cn.StartWriter()

	if err != nil { // unknown or expired session, or no new one allowed: say so, then close
		cn.Log.Info("session refused", zap.String("code", parley.ErrorCode(err)), zap.String("reason", parley.ErrorMessage(err)))
		reason := "unknown session"
		if parley.ErrorCode(err) == parley.ENotFound {
			cn.sendError(err)
		} else {
			// A readable line and the sentinel (text mode), so a simple
			// client that sends its prompt at once never hangs.
			s.countRefusal(err)
			cn.replyError(err)
			reason = "no new session: " + parley.ErrorCode(err)
		}
		cn.Close(apicore.CloseCode(err), reason)
		cn.Finish(writerDone)
		return nil
	}
	cn.id = sess.ID
	cn.model.Store(&sess.Model)
	cn.Log = s.log.With(zap.String("session", sess.ID), zap.String("remote", ip))
	if user != "" {
		cn.Log = cn.Log.With(zap.String("user", user)) // the name, never the key
	}
	cn.Log.Info("session open", zap.Bool("resumed", resumed), zap.Bool("json", jsonMode),
		zap.Int("messages", len(sess.Messages)))
	start := time.Now()
	rp, ok := cn.greet(r.Context(), sess, resumed, resumeFrom)
	if !ok {
		cn.Finish(writerDone)
		return nil
	}

	workerDone := make(chan struct{})
	go func() {
		defer close(workerDone)
		if rp != nil {
			cn.followResumed(rp)
		}
		cn.worker()
	}()

	cn.reader()
	cn.Close(websocket.CloseNormalClosure, "")
	<-workerDone
	cn.Finish(writerDone)
	cn.Log.Info("session close", zap.Duration("duration", time.Since(start)), zap.Int("close_code", cn.CloseCode()))
	return nil
}

// socketMode reads how a chat socket talks: JSON mode (?format=json or the
// subprotocol), and where a resumed reply picks up (?resume_from=, -1: not
// given).
func socketMode(r *http.Request) (jsonMode bool, resumeFrom int, err error) {
	jsonMode = r.URL.Query().Get("format") == "json"
	for _, p := range websocket.Subprotocols(r) {
		if p == SubprotocolJSON {
			jsonMode = true
		}
	}
	resumeFrom, err = parseResumeFrom(r.URL.Query().Get("resume_from"))
	return jsonMode, resumeFrom, err
}

func (c *conn) Replying() bool { return c.busy.Load() }

// who is the caller the connection's session requests are for: its user,
// and its client (the user, or its address).
func (c *conn) who() parley.Caller {
	return parley.Caller{User: c.user, Client: apicore.UserClient(c.ip, c.user)}
}

// answerOnSocket reports whether an error of Open is told over the
// upgraded socket (a readable message, then a close) rather than as an
// HTTP error before the upgrade: an unknown session, and a new session
// the client may not have now (over its limits, or the store is full).
func answerOnSocket(err error) bool {
	switch parley.ErrorCode(err) {
	case parley.ENotFound, parley.ERateLimited, parley.EStoreFull:
		return true
	}
	return false
}

func (c *conn) cancelTurn() {
	c.turnMu.Lock()
	defer c.turnMu.Unlock()
	if c.turnCancel != nil {
		c.turnCancel()
	}
}

// reader reads client messages until the connection ends. It validates
// frames (text only, valid UTF-8, size limit via SetReadLimit) and hands
// prompts to the worker.
func (c *conn) reader() {
	c.StartReadDeadline()
	for {
		mt, data, held, dropped, ok := c.read()
		if !ok {
			return
		}
		if !dropped && !c.take(mt, data, held) {
			return
		}
		if c.Ctx.Err() != nil {
			return
		}
	}
}

// take takes in one message the reader read, and gives back the bytes of
// the body budget it held (held) once it is taken in. It reports false
// when the message closed the connection.
func (c *conn) take(mt int, data []byte, held int64) bool {
	defer c.giveBody(held)
	if mt != websocket.TextMessage {
		c.Close(websocket.CloseUnsupportedData, "binary messages are not accepted: send text")
		return false
	}
	if !utf8.Valid(data) {
		c.Close(websocket.CloseInvalidFramePayloadData, "text message is not valid UTF-8")
		return false
	}
	if c.json {
		c.handleJSON(data)
	} else {
		c.enqueuePrompt(job{kind: jobPrompt, content: string(data), params: c.srv.cfg.Defaults})
	}
	return true
}

// read reads the next message. In JSON mode a message may pass
// MaxMessageBytes when images make up the difference (handleJSON checks
// that they do), up to MaxImageMessageBytes, its bytes past
// MaxMessageBytes held from the server's body budget (held: the caller
// gives them back once the message is taken in); a message over its cap,
// or refused by the budget, is read to its end, dropped and answered with
// an error (dropped). ok is false when the connection ended.
func (c *conn) read() (mt int, data []byte, held int64, dropped, ok bool) {
	limit := c.srv.cfg.MaxImageMessageBytes
	if !c.json || limit <= c.srv.cfg.MaxMessageBytes {
		mt, data, ok = c.Read()
		return mt, data, 0, false, ok
	}
	var take func(int64) error
	if c.srv.hooks.TakeBody != nil {
		client := c.who().Client
		take = func(n int64) error { return c.srv.hooks.TakeBody(client, n) }
	}
	mt, data, held, refusal, ok := c.ReadCapped(limit, c.srv.cfg.MaxMessageBytes, take)
	if !ok || refusal != nil {
		c.giveBody(held)
		held = 0
	}
	switch {
	case !ok:
		return 0, nil, 0, false, false
	case errors.Is(refusal, wsock.ErrMessageTooLarge):
		c.refuse(wsock.RefusedMessageSize, parley.Errorf(parley.ETooLarge,
			"the message is over %d bytes, the most one with images may be (%d without; --max-message-bytes, --image-max-bytes, --image-max-per-request)",
			limit, c.srv.cfg.MaxMessageBytes))
		return mt, nil, 0, true, true
	case refusal != nil:
		c.srv.countRefusal(refusal) // the body budget's cause
		c.answer(refusal)
		return mt, nil, 0, true, true
	}
	return mt, data, held, false, true
}

// giveBody gives back n bytes read() held of the body budget.
func (c *conn) giveBody(n int64) {
	if n > 0 && c.srv.hooks.GiveBody != nil {
		c.srv.hooks.GiveBody(c.who().Client, n)
	}
}

func (c *conn) handleJSON(data []byte) {
	m, err := parseClientMessage(data)
	if err != nil {
		c.answer(err)
		return
	}
	if rest := int64(len(data)) - m.imageBytes(); rest > c.srv.cfg.MaxMessageBytes {
		// Past MaxMessageBytes only by its images: the rest of it keeps
		// the cap of a message without them.
		c.refuse(wsock.RefusedMessageSize, parley.Errorf(parley.ETooLarge,
			"the message is over %d bytes without its images (%d bytes)", c.srv.cfg.MaxMessageBytes, rest))
		return
	}
	switch m.Type {
	case "prompt", "tool_result":
		p, server, err := c.srv.resolveWSParams(m.Params)
		if err != nil {
			c.answer(err)
			return
		}
		model, err := c.srv.core.ResolveModel(m.Model)
		if err != nil {
			c.answer(err)
			return
		}
		if m.Model == "" {
			model = ""
		}
		images, err := c.srv.promptImages(context.Background(), m)
		if err != nil {
			c.answer(err)
			return
		}
		c.enqueuePrompt(job{kind: jobPrompt, content: *m.Content, images: images, callID: m.ToolCallID, model: model, params: p, server: server})
	case "regenerate":
		p, server, err := c.srv.resolveWSParams(m.Params)
		if err == nil && server != nil {
			err = parley.FieldErrorf("params.tools", "tools that run on the server are for prompts and tool results")
		}
		if err != nil {
			c.answer(err)
			return
		}
		c.enqueuePrompt(job{kind: jobPrompt, regen: true, params: p})
	case "continue":
		p, server, err := c.srv.resolveWSParams(m.Params)
		if err == nil && server != nil {
			err = parley.FieldErrorf("params.tools", "tools that run on the server are for prompts and tool results")
		}
		if err != nil {
			c.answer(err)
			return
		}
		c.enqueuePrompt(job{kind: jobPrompt, cont: true, params: p})
	case "cancel":
		c.cancelTurn()
	case "reset":
		c.cancelTurn()
		c.enqueue(job{kind: jobReset})
	case "system":
		c.enqueue(job{kind: jobSystem, content: *m.Content})
	}
}

// enqueuePrompt queues j, a prompt (or a tool's result, or a regenerate),
// or its refusal: shutting down, over the rate, or over the prompt-token cap.
func (c *conn) enqueuePrompt(j job) {
	if c.srv.draining.Load() {
		c.answer(parley.Errorf(parley.EUnavailable, "the server is shutting down; reconnect shortly"))
		return
	}
	if !c.limiter.allow(time.Now()) {
		c.refuse("rate_limited", parley.Errorf(parley.ERateLimited, "too many prompts: at most %d per minute", c.srv.cfg.PromptsPerMinute))
		return
	}
	if err := c.srv.core.CountPromptTokens(c.Ctx, cmp.Or(j.model, c.getModel()), j.content, 0, false); err != nil {
		c.refuse("prompt_tokens", err)
		return
	}
	c.enqueue(j)
}

func (c *conn) enqueue(j job) {
	if !c.inbox.push(j) {
		c.refuse("queue_full", parley.Errorf(parley.EBusy, "too many prompts waiting on this connection (at most %d)", c.srv.cfg.MaxQueuedPrompts))
	}
}

// refuse answers a message with err in its turn (see answer) and logs the
// refusal with its cause, once per run of equal refusals so that a flood
// of refused prompts cannot flood the log.
func (c *conn) refuse(cause string, err error) {
	c.srv.refused(cause)
	if c.answer(err) {
		c.Log.Warn("prompt refused", zap.String("cause", cause), zap.String("code", parley.ErrorCode(err)))
	}
}

// answer queues err as the answer to a message that is not queued itself
// (a refusal, an invalid message), behind what is queued, so every answer
// reaches the client in the order of the messages it answers: never inside
// a reply that is streaming. It reports whether the answer started a new
// run (it was not merged into an equal one before it). A client that
// piles up more answers than the inbox holds is closed with 1008.
func (c *conn) answer(err error) (newRun bool) {
	newRun, ok := c.inbox.pushAnswer(err)
	if !ok {
		c.Log.Warn("too many messages waiting: disconnecting", zap.Int("items", c.inbox.len()))
		c.Close(websocket.ClosePolicyViolation, "too many messages waiting")
	}
	return newRun
}

// worker runs jobs in order until the connection ends.
func (c *conn) worker() {
	for {
		j, ok := c.inbox.pop()
		if !ok {
			select {
			case <-c.Ctx.Done():
				return
			case <-c.inbox.wake:
			}
			continue
		}
		if c.Ctx.Err() != nil {
			return
		}
		switch j.kind {
		case jobAnswer:
			for range j.n {
				if !c.replyErrorWait(j.err) {
					return
				}
			}
		case jobPrompt:
			if c.srv.draining.Load() {
				// Let the running reply finish, not the queue behind it.
				c.replyErrorWait(parley.Errorf(parley.EUnavailable, "the server is shutting down; reconnect shortly"))
				continue
			}
			if j.model != "" && j.model != c.getModel() {
				if err := c.setModel(j.model); err != nil {
					if !c.replyErrorWait(err) {
						return
					}
					continue
				}
			}
			c.runTurn(j)
		case jobReset:
			if err := c.srv.sessions.Reset(c.Ctx, c.who(), c.id); err != nil {
				c.sendError(err)
				continue
			}
			c.Log.Info("session reset")
			c.sendSession(c.id, false, nil)
		case jobSystem:
			if err := c.srv.sessions.SetSystem(c.Ctx, c.who(), c.id, j.content); err != nil {
				c.sendError(err)
			}
		}
	}
}

// getModel is the session's model ("" with one model, or before the session opened).
func (c *conn) getModel() string {
	if m := c.model.Load(); m != nil {
		return *m
	}
	return ""
}

// modelSetter is the session layer's SetModel (*session.Service has it).
type modelSetter interface {
	SetModel(ctx context.Context, who parley.Caller, id, model string) error
}

// setModel makes model the session's, before its first turn (see
// session.Service.SetModel).
func (c *conn) setModel(model string) error {
	ms, ok := c.srv.sessions.(modelSetter)
	if !ok {
		return parley.FieldErrorf("model", "is not supported by this server's sessions")
	}
	if err := ms.SetModel(c.Ctx, c.who(), c.id, model); err != nil {
		return err
	}
	c.model.Store(&model)
	c.Log.Info("session model", zap.String("model", model))
	return nil
}

// replyError tells the client a prompt failed: in text mode a readable line
// then the sentinel (so a simple client never hangs), in JSON mode an error event.
func (c *conn) replyError(err error) {
	for _, b := range c.errorFrames(err) {
		c.SendRaw(b)
	}
}

// sendError tells the client err outside a reply (a failed reset or
// system prompt, an unknown session): one frame, no sentinel.
func (c *conn) sendError(err error) { c.SendRaw(c.errorFrame(err)) }

func (c *conn) sendSession(id string, resumed bool, msgs []parley.Message) {
	c.SendJSON(sessionMessage{Type: "session", ID: id, Resumed: resumed, Model: c.getModel(), Messages: history(msgs)})
}

// replyErrorWait is replyError for the worker's queued answers: it waits up
// to WriteWait for room in the send buffer (so a long run of answers is
// paced by the client, not dropped), and reports whether the connection
// lives on.
func (c *conn) replyErrorWait(err error) bool {
	for _, b := range c.errorFrames(err) {
		if !c.SendWait(b) {
			return false
		}
	}
	return true
}

// errorFrames are the frames that tell the client a prompt failed: in text
// mode a readable line then the sentinel, in JSON mode an error event.
func (c *conn) errorFrames(err error) [][]byte {
	if !c.json {
		return [][]byte{c.errorFrame(err), []byte(Sentinel)}
	}
	return [][]byte{c.errorFrame(err)}
}

// errorFrame is the one frame that tells the client err: in text mode a
// readable line, in JSON mode an error event.
func (c *conn) errorFrame(err error) []byte {
	if !c.json {
		return []byte(errorLine(err))
	}
	b, _ := json.Marshal(errorMessage{Type: "error", Code: parley.ErrorCode(err), Message: parley.ErrorMessage(err), Field: apicore.ErrorField(err), RetryAfter: apicore.RetryAfterSeconds(err)})
	return b
}

// errorLine is an error as text mode shows it: one line a person reads,
// with when to try again when the error says.
func errorLine(err error) string {
	line := "Error: " + parley.ErrorMessage(err)
	if d := apicore.RetryAfterSeconds(err); d > 0 {
		line += " (try again in " + strconv.Itoa(d) + " s)"
	}
	return line
}

// cancelCause is who cancelled a reply on this connection. The connection's
// context ends only after close has recorded the close code, so reading
// closeCode after seeing ctx.Err() is ordered by the context's lock. The
// server closes with 1008 (wsock.CloseTooSlow) a client that stopped reading or
// piled up messages: either way the client, not the server, ended it.
func (c *conn) cancelCause() string {
	if c.Ctx.Err() == nil {
		return apicore.CancelByClient // the connection lives on: a cancel or reset message
	}
	switch {
	case c.CloseCode() == wsock.CloseTooSlow:
		return apicore.CancelBySlowClient
	case c.CloseCode() == websocket.CloseGoingAway && c.srv.draining.Load():
		return apicore.CancelByShutdown
	}
	return apicore.CancelByDisconnect
}
