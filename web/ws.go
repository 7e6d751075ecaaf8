package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// WebSocket timing and sizes. The invariants follow gorilla's examples.
const (
	// writeWait bounds every write, so a client that stops reading is
	// dropped instead of blocking its writer forever.
	writeWait = 10 * time.Second
	// pongWait is how long the reader waits for any frame (pongs included)
	// before dropping the peer.
	pongWait = 60 * time.Second
	// pingPeriod must be less than pongWait: 9/10 of it leaves room for the pong.
	pingPeriod = pongWait * 9 / 10
	// closeGrace is how long we wait for the peer's close frame after sending ours.
	closeGrace = time.Second
	// sendBuffer bounds the messages queued for a connection's writer. A
	// client that lets it fill is too slow: it is disconnected and its reply
	// cancelled, so memory stays bounded whatever it does.
	sendBuffer = 1024
	// maxQueuedJobs bounds prompts and control messages waiting behind the
	// reply that is streaming. Prompts are queued, never interleaved.
	maxQueuedJobs = 16

	subprotocolJSON      = "parley.v1+json"
	subprotocolKeyPrefix = "parley.key."

	// closeTooSlow is sent to a client that stopped reading (policy violation).
	closeTooSlow = websocket.ClosePolicyViolation
)

// conn is one WebSocket connection: one reader (the handler goroutine), one
// writer, and one worker that runs the session's turns in order.
type conn struct {
	srv  *Server
	ws   *websocket.Conn
	ip   string
	json bool
	id   string // session id
	log  *zap.Logger

	send chan []byte // text frames for the writer
	jobs chan job    // prompts and control messages for the worker

	ctx       context.Context // ends when the connection ends
	cancel    context.CancelFunc
	closeOnce sync.Once
	closeCode int
	closeText string

	busy       atomic.Bool // a turn is running
	turnMu     sync.Mutex
	turnCancel context.CancelFunc // cancels the running turn; guarded by turnMu

	limiter *rateLimiter
}

type jobKind int

const (
	jobPrompt jobKind = iota
	jobReset
	jobSystem
)

type job struct {
	kind    jobKind
	content string
	params  parley.Params
}

// clientMessage is what a client sends in JSON mode.
type clientMessage struct {
	Type    string       `json:"type"`
	Content *string      `json:"content"`
	Params  *paramsPatch `json:"params"`
}

func (s *Server) handleWebSocket(c echo.Context) error {
	r, w := c.Request(), c.Response()
	if s.draining.Load() {
		return parley.Errorf(parley.EUnavailable, "the server is shutting down")
	}
	if !s.authorized(r) {
		return parley.Errorf(parley.EUnauthorized, "missing or wrong API key")
	}
	if !s.checkOrigin(r) {
		s.log.Warn("cross-origin upgrade refused", zap.String("origin", r.Header.Get("Origin")))
		return parley.Errorf(parley.EForbidden, "cross-origin WebSocket upgrades are not allowed")
	}
	ip := clientIP(r)
	if err := s.admit(ip); err != nil {
		s.log.Warn("connection refused", zap.String("remote", ip), zap.Error(err))
		return err
	}
	released := false
	release := func() {
		if !released {
			released = true
			s.releaseIP(ip)
		}
	}
	defer release()

	jsonMode := r.URL.Query().Get("format") == "json"
	for _, p := range websocket.Subprotocols(r) {
		if p == subprotocolJSON {
			jsonMode = true
		}
	}
	sess, resumed, err := s.sessions.Open(r.Context(), r.URL.Query().Get("session"))
	if err != nil && parley.ErrorCode(err) != parley.ENotFound {
		return err
	}
	hdr := http.Header{}
	if sess != nil {
		hdr.Set("X-Parley-Session", sess.ID)
	}
	ws, uerr := s.upgrader.Upgrade(w, r, hdr)
	if uerr != nil {
		return nil // the upgrader has written the response
	}
	ws.SetReadLimit(s.cfg.MaxMessageBytes)

	ctx, cancel := context.WithCancel(context.Background())
	cn := &conn{
		srv: s, ws: ws, ip: ip, json: jsonMode, log: s.log.With(zap.String("remote", ip)),
		send:    make(chan []byte, sendBuffer),
		jobs:    make(chan job, maxQueuedJobs),
		ctx:     ctx,
		cancel:  cancel,
		limiter: newRateLimiter(s.cfg.PromptsPerMinute, time.Minute),
	}
	if !s.track(cn) {
		cancel()
		ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseGoingAway, "server shutting down"), time.Now().Add(writeWait))
		ws.Close()
		return nil
	}
	defer s.untrack(cn)

	var writerDone, workerDone sync.WaitGroup
	writerDone.Add(1)
	go func() { defer writerDone.Done(); cn.writer() }()

	if err != nil { // unknown or expired session: say so, then close
		cn.sendError(err)
		cn.close(closeCodeFor(err), "unknown session")
		writerDone.Wait()
		cn.finishClose()
		return nil
	}
	cn.id = sess.ID
	cn.log = s.log.With(zap.String("session", sess.ID), zap.String("remote", ip))
	cn.log.Info("session open", zap.Bool("resumed", resumed), zap.Bool("json", jsonMode),
		zap.Int("messages", len(sess.Messages)))
	start := time.Now()
	if jsonMode {
		cn.sendSession(sess.ID, resumed, sess.Messages)
	}

	workerDone.Add(1)
	go func() { defer workerDone.Done(); cn.worker() }()

	cn.reader()
	cn.close(websocket.CloseNormalClosure, "")
	workerDone.Wait()
	writerDone.Wait()
	cn.finishClose()
	cn.log.Info("session close", zap.Duration("duration", time.Since(start)), zap.Int("close_code", cn.closeCode))
	return nil
}

// admit enforces the connection caps.
func (s *Server) admit(ip string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) >= s.cfg.MaxConns {
		return parley.Errorf(parley.EBusy, "too many open connections; try again later")
	}
	if s.perIP[ip] >= s.cfg.MaxConnsPerIP {
		return parley.Errorf(parley.ERateLimited, "too many open connections from your address")
	}
	s.perIP[ip]++
	return nil
}

func (s *Server) releaseIP(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// OpenConns is the number of open WebSocket connections.
func (s *Server) OpenConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// close ends the connection with a close code: the writer sends the close
// frame, the reader and worker stop. Safe to call many times; the first wins.
func (c *conn) close(code int, text string) {
	c.closeOnce.Do(func() {
		c.closeCode, c.closeText = code, text
		c.cancel()
		c.cancelTurn()
	})
}

// finishClose waits briefly for the peer's close frame, then drops the TCP connection.
func (c *conn) finishClose() {
	c.ws.SetReadDeadline(time.Now().Add(closeGrace))
	for {
		if _, _, err := c.ws.NextReader(); err != nil {
			break
		}
	}
	c.ws.Close()
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
	c.ws.SetReadDeadline(time.Now().Add(pongWait))
	c.ws.SetPongHandler(func(string) error {
		c.ws.SetReadDeadline(time.Now().Add(pongWait))
		return nil
	})
	for {
		mt, data, err := c.ws.ReadMessage()
		if err != nil {
			switch {
			case errors.Is(err, websocket.ErrReadLimit):
				// gorilla has already sent 1009.
				c.log.Warn("message over the size limit", zap.Int64("limit", c.srv.cfg.MaxMessageBytes))
				c.close(websocket.CloseMessageTooBig, "")
			case websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived):
			case c.ctx.Err() != nil:
			default:
				c.log.Debug("read ended", zap.Error(err))
			}
			return
		}
		c.ws.SetReadDeadline(time.Now().Add(pongWait))
		if mt != websocket.TextMessage {
			c.close(websocket.CloseUnsupportedData, "binary messages are not accepted: send text")
			return
		}
		if !utf8.Valid(data) {
			c.close(websocket.CloseInvalidFramePayloadData, "text message is not valid UTF-8")
			return
		}
		if c.json {
			c.handleJSON(data)
		} else {
			c.enqueuePrompt(string(data), c.srv.cfg.Defaults)
		}
		if c.ctx.Err() != nil {
			return
		}
	}
}

func (c *conn) handleJSON(data []byte) {
	var m clientMessage
	if err := decodeJSON(bytes.NewReader(data), &m); err != nil {
		c.sendError(err)
		return
	}
	switch m.Type {
	case "prompt":
		if m.Content == nil {
			c.sendError(parley.FieldErrorf("content", "is required"))
			return
		}
		p, err := c.srv.resolveParams(m.Params)
		if err != nil {
			c.sendError(err)
			return
		}
		c.enqueuePrompt(*m.Content, p)
	case "cancel":
		c.cancelTurn()
	case "reset":
		c.cancelTurn()
		c.enqueue(job{kind: jobReset})
	case "system":
		if m.Content == nil {
			c.sendError(parley.FieldErrorf("content", "is required"))
			return
		}
		c.enqueue(job{kind: jobSystem, content: *m.Content})
	case "":
		c.sendError(parley.FieldErrorf("type", "is required"))
	default:
		c.sendError(parley.FieldErrorf("type", "unknown message type %q (want prompt, cancel, reset or system)", m.Type))
	}
}

func (c *conn) enqueuePrompt(prompt string, p parley.Params) {
	if c.srv.draining.Load() {
		c.replyError(parley.Errorf(parley.EUnavailable, "the server is shutting down; reconnect shortly"))
		return
	}
	if !c.limiter.allow(time.Now()) {
		c.log.Warn("prompt refused", zap.String("cause", "rate_limited"))
		c.replyError(parley.Errorf(parley.ERateLimited, "too many prompts: at most %d per minute", c.srv.cfg.PromptsPerMinute))
		return
	}
	c.enqueue(job{kind: jobPrompt, content: prompt, params: p})
}

func (c *conn) enqueue(j job) {
	select {
	case c.jobs <- j:
	default:
		c.log.Warn("prompt refused", zap.String("cause", "queue_full"))
		c.replyError(parley.Errorf(parley.EBusy, "too many prompts waiting on this connection (at most %d)", maxQueuedJobs))
	}
}

// worker runs jobs in order until the connection ends.
func (c *conn) worker() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case j := <-c.jobs:
			switch j.kind {
			case jobPrompt:
				c.runTurn(j.content, j.params)
			case jobReset:
				if err := c.srv.sessions.Reset(c.ctx, c.id); err != nil {
					c.sendError(err)
					continue
				}
				c.log.Info("session reset")
				c.sendSession(c.id, false, nil)
			case jobSystem:
				if err := c.srv.sessions.SetSystem(c.ctx, c.id, j.content); err != nil {
					c.sendError(err)
				}
			}
		}
	}
}

// runTurn streams one reply. In text mode every non-empty piece is a text
// message and the sentinel follows the final event; in JSON mode tokens and
// the done event are JSON objects.
func (c *conn) runTurn(prompt string, p parley.Params) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.turnMu.Lock()
	c.turnCancel = cancel
	c.turnMu.Unlock()
	c.busy.Store(true)
	defer func() {
		c.turnMu.Lock()
		c.turnCancel = nil
		c.turnMu.Unlock()
		cancel()
		c.busy.Store(false)
	}()

	turn, err := c.srv.sessions.Turn(ctx, c.id, prompt, p)
	if err != nil {
		c.log.Info("reply refused", zap.String("code", parley.ErrorCode(err)), zap.String("reason", parley.ErrorMessage(err)))
		c.replyError(err)
		return
	}
	for ev := range turn.Events() {
		if !ev.Done {
			if c.json {
				c.sendJSON(tokenMessage{Type: "token", ID: ev.Token.ID, Text: ev.Token.Text, Logprob: finite(ev.Token.Logprob), Special: ev.Token.Special})
			} else if ev.Token.Text != "" {
				c.sendText(ev.Token.Text)
			}
			continue
		}
		c.logReply(ev)
		if ev.Finish == parley.FinishError {
			c.replyError(errOr(ev.Err))
			continue
		}
		if c.json {
			c.sendJSON(newDoneMessage(ev, turn.Text()))
		} else {
			c.sendText(Sentinel)
		}
	}
}

func errOr(err error) error {
	if err == nil {
		return parley.Errorf(parley.EInternal, "the reply failed")
	}
	return err
}

func (c *conn) logReply(ev parley.Event) {
	fields := []zap.Field{
		zap.String("finish", string(ev.Finish)),
		zap.Int("prompt_tokens", ev.Usage.PromptTokens),
		zap.Int("cached_prompt_tokens", ev.Usage.CachedPromptTokens),
		zap.Int("reply_tokens", ev.Usage.CompletionTokens),
		zap.Duration("ttft", ev.Timings.TimeToFirstToken),
		zap.Float64("tokens_per_second", round2(ev.Timings.TokensPerSecond(ev.Usage.CompletionTokens))),
		zap.Duration("total", ev.Timings.Total),
	}
	if ev.Err != nil {
		fields = append(fields, zap.Error(ev.Err))
	}
	c.log.Info("reply", fields...)
}

// replyError tells the client a prompt failed: in text mode a readable line
// then the sentinel (so a simple client never hangs), in JSON mode an error event.
func (c *conn) replyError(err error) {
	if c.json {
		c.sendError(err)
		return
	}
	c.sendText("Error: " + parley.ErrorMessage(err))
	c.sendText(Sentinel)
}

func (c *conn) sendError(err error) {
	if !c.json {
		c.sendText("Error: " + parley.ErrorMessage(err))
		return
	}
	var pe *parley.Error
	field := ""
	if errors.As(err, &pe) {
		field = pe.Field
	}
	c.sendJSON(errorMessage{Type: "error", Code: parley.ErrorCode(err), Message: parley.ErrorMessage(err), Field: field})
}

func (c *conn) sendSession(id string, resumed bool, msgs []parley.Message) {
	if msgs == nil {
		msgs = []parley.Message{}
	}
	c.sendJSON(sessionMessage{Type: "session", ID: id, Resumed: resumed, Messages: msgs})
}

func (c *conn) sendJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.log.Error("encode message", zap.Error(err))
		return
	}
	c.sendRaw(b)
}

func (c *conn) sendText(s string) { c.sendRaw([]byte(s)) }

// sendRaw queues a frame for the writer without ever blocking: a full
// buffer means the client stopped reading.
func (c *conn) sendRaw(b []byte) {
	if c.ctx.Err() != nil {
		return
	}
	select {
	case c.send <- b:
	default:
		if c.log != nil {
			c.log.Warn("client too slow: disconnecting", zap.Int("buffered", len(c.send)))
		}
		c.close(closeTooSlow, "client too slow")
	}
}

// writer is the only goroutine that writes to the socket (besides gorilla's
// own control frames). It drains queued frames, pings, and on close sends
// the close frame.
func (c *conn) writer() {
	ping := time.NewTicker(pingPeriod)
	defer ping.Stop()
	for {
		select {
		case b := <-c.send:
			if err := c.write(websocket.TextMessage, b); err != nil {
				c.close(websocket.CloseAbnormalClosure, "")
				return
			}
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
				c.close(websocket.CloseAbnormalClosure, "")
				return
			}
		case <-c.ctx.Done():
			// Flush what is queued (the error or the sentinel that explains the close).
			for {
				select {
				case b := <-c.send:
					if c.write(websocket.TextMessage, b) != nil {
						return
					}
					continue
				default:
				}
				break
			}
			if c.closeCode != websocket.CloseAbnormalClosure {
				msg := websocket.FormatCloseMessage(c.closeCode, c.closeText)
				c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(writeWait))
			}
			return
		}
	}
}

func (c *conn) write(mt int, b []byte) error {
	c.ws.SetWriteDeadline(time.Now().Add(writeWait))
	return c.ws.WriteMessage(mt, b)
}
