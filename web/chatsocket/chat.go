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
	// hold is what a prompt's images hold of the body budget while it
	// waits in the queue (their bytes, which the turn decodes): the
	// images of waiting prompts are bounded by the budget, per client and
	// in all, not only by the queue. The worker releases it when it takes
	// the prompt, the connection's end when the prompt never runs.
	hold wsock.Hold
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
	ws, ok := s.sockets.Upgrade(w, r, hdr, s.messageCaps(jsonMode).ReadLimit())
	if !ok {
		return nil // the upgrader has written the response
	}

	// The connection outlives the upgrade request: its own context, a child
	// of the server's stop context, which names the client like the request's
	// (a session the connection writes first is the client's).
	cn := &conn{
		srv:      s,
		Pump:     wsock.NewPump(s.sockets.Settings(), s.stop, ws, s.messageCaps(jsonMode).ReadLimit(), s.log.With(zap.String("remote", ip))),
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
	// The prompts left waiting give back the budget their images held.
	for j, ok := cn.inbox.pop(); ok; j, ok = cn.inbox.pop() {
		j.hold.Release()
	}
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

// messageCaps are the sizes of a connection's messages: MaxMessageBytes,
// and in JSON mode as much more as a message's images may take
// (MaxImageMessageBytes), its bytes past MaxMessageBytes held from the
// server's body budget while it is read and taken in.
func (s *Chat) messageCaps(jsonMode bool) wsock.Caps {
	caps := wsock.Caps{Plain: s.cfg.MaxMessageBytes, Free: s.cfg.MaxMessageBytes}
	if jsonMode {
		caps.Max = s.cfg.MaxImageMessageBytes
	}
	return caps
}

// reader reads client messages until the connection ends. It validates
// frames (text only, valid UTF-8, the size caps) and hands prompts to the
// worker. A message over its cap, or one the body budget has no room for,
// is answered with an error and the connection lives on.
func (c *conn) reader() {
	c.StartReadDeadline()
	caps, bodies, client := c.srv.messageCaps(c.json), c.srv.sockets.Settings().Bodies, c.who().Client
	for {
		mt, data, hold, refusal, ok := c.ReadMessage(caps, bodies, client)
		if !ok {
			return
		}
		if refusal != nil {
			if c.answer(refusal) {
				c.Log.Warn("message refused", zap.String("code", parley.ErrorCode(refusal)))
			}
		} else if !c.take(mt, data, &hold) {
			return
		}
		if c.Ctx.Err() != nil {
			return
		}
	}
}

// take takes in one message the reader read, and gives back what it holds
// of the body budget (hold) once it is taken in, but for what a prompt's
// images keep held while the prompt waits in the queue. It reports false
// when the message closed the connection.
func (c *conn) take(mt int, data []byte, hold *wsock.Hold) bool {
	defer hold.Release()
	if mt != websocket.TextMessage {
		c.Close(websocket.CloseUnsupportedData, "binary messages are not accepted: send text")
		return false
	}
	if !utf8.Valid(data) {
		c.Close(websocket.CloseInvalidFramePayloadData, "text message is not valid UTF-8")
		return false
	}
	if c.json {
		c.handleJSON(data, hold)
	} else {
		c.enqueuePrompt(job{kind: jobPrompt, content: string(data), params: c.srv.cfg.Defaults})
	}
	return true
}

// handleJSON takes in a JSON-mode message, which holds hold of the body
// budget.
func (c *conn) handleJSON(data []byte, hold *wsock.Hold) {
	m, err := parseClientMessage(data)
	if err != nil {
		c.answer(err)
		return
	}
	if err := c.CheckRest(c.srv.messageCaps(true), int64(len(data)), m.imageBytes()); err != nil {
		if c.answer(err) {
			c.Log.Warn("message refused", zap.String("code", parley.ErrorCode(err)))
		}
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
		// The images wait in the queue holding their bytes of the budget
		// (see job.hold).
		imgHold, err := hold.Split(imageBytes(images))
		if err != nil {
			c.srv.countRefusal(err) // the budget's cause
			c.answer(waitingImagesRefusal(err))
			return
		}
		c.enqueuePrompt(job{kind: jobPrompt, content: *m.Content, images: images, hold: imgHold, callID: m.ToolCallID, model: model, params: p, server: server})
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
// or its refusal: shutting down, over the rate, or over the prompt-token
// cap. A refused prompt gives back what its hold holds.
func (c *conn) enqueuePrompt(j job) {
	if c.srv.draining.Load() {
		j.hold.Release()
		c.answer(parley.Errorf(parley.EUnavailable, "the server is shutting down; reconnect shortly"))
		return
	}
	if !c.limiter.allow(time.Now()) {
		j.hold.Release()
		c.refuse("rate_limited", parley.Errorf(parley.ERateLimited, "too many prompts: at most %d per minute", c.srv.cfg.PromptsPerMinute))
		return
	}
	if err := c.srv.core.CountPromptTokens(c.Ctx, cmp.Or(j.model, c.getModel()), j.content, 0, false); err != nil {
		j.hold.Release()
		c.refuse("prompt_tokens", err)
		return
	}
	c.enqueue(j)
}

// enqueue queues j, or refuses it (giving back what its hold holds) when
// the queue is full.
func (c *conn) enqueue(j job) {
	if !c.inbox.push(j) {
		j.hold.Release()
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
		// A prompt taken from the queue no longer waits: its images go
		// to its turn (which decodes them), their bytes off the budget.
		j.hold.Release()
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
