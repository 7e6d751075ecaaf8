package chatsocket

// The chat socket's side of a reply (replies.go): the socket that asks
// follows its reply, and a socket that resumes the session sees the reply
// in flight in its history and follows it from where its client is.

import (
	"context"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// historyMessage is a message of the session message's history; Status is
// "generating" on the reply in flight (its text so far).
type historyMessage struct {
	parley.Message
	Status string `json:"status,omitempty"`
}

// liveReplyJSON tells a resuming client about the reply in flight: the
// history's last message holds its tokens up to Seq, and the token
// messages that follow continue from there (or from resume_from).
type liveReplyJSON struct {
	Status string `json:"status"` // "generating"
	Seq    int    `json:"seq"`
}

// resumePoint is what a resuming socket does once its history is sent:
// follow reply from token seq from, text mode first sending missing.
type resumePoint struct {
	reply   *liveReply
	leave   func()
	from    int
	missing string
}

// parseResumeFrom reads ?resume_from=N: in JSON mode the seq of the last
// token the client has, in text mode the bytes of reply text it has. -1
// when absent.
func parseResumeFrom(q string) (int, error) {
	if q == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(q)
	if err != nil || n < 0 {
		return 0, parley.FieldErrorf("resume_from", "must be a whole number, 0 or more")
	}
	return n, nil
}

// runTurn streams one reply. In text mode every non-empty piece is a text
// message and the sentinel follows the final event; in JSON mode tokens
// (each with its seq) and the done event are JSON objects. The reply runs
// on the server's context, not the socket's: when the socket drops it goes
// on for the resume grace (see liveReply).
func (c *conn) runTurn(j job) {
	prompt, p := j.content, j.params
	r := c.srv.replies.open(c, prompt)
	r.model = c.getModel()
	leave := r.follow(c.Ctx, c.cancelCause)
	defer leave()
	if c.Ctx.Err() != nil { // the socket is gone: nobody waits for this prompt
		r.fail()
		return
	}
	c.setTurn(r)
	defer c.clearTurn()

	p.SkipLogprobs = !c.json // text mode sends only the pieces
	var opts []session.TurnOption
	if c.json && c.srv.models != nil {
		// A prompt that waits for its model to load sees the load's progress.
		opts = append(opts, session.ShowLoadProgress(func(model string, frac float64) {
			c.SendJSON(loadingMessage{Type: "loading", Model: model, Progress: frac})
		}))
	}
	turn, err := c.startTurn(r.ctx, j, p, opts...)
	if err != nil {
		r.fail()
		c.Log.Info("reply refused", zap.String("code", parley.ErrorCode(err)), zap.String("reason", parley.ErrorMessage(err)))
		c.srv.countRefusal(err)
		c.replyError(err)
		return
	}
	r.start(turn)
	c.stream(r, 0, "")
}

// setTurn makes r the reply that a cancel (or reset) message cancels, at
// once. Closing the socket does not: close cancels the turn after the
// socket's context, and a reply outlives its socket for the grace.
func (c *conn) setTurn(r *liveReply) {
	c.turnMu.Lock()
	c.turnCancel = func() {
		if c.Ctx.Err() == nil {
			r.stop(apicore.CancelByClient)
		}
	}
	c.turnMu.Unlock()
	c.busy.Store(true)
}

func (c *conn) clearTurn() {
	c.turnMu.Lock()
	c.turnCancel = nil
	c.turnMu.Unlock()
	c.busy.Store(false)
}

// stream sends r's tokens after seq from (text mode: missing first, as one
// message), then its end (done, the sentinel or an error), until the reply
// or the socket ends.
func (c *conn) stream(r *liveReply, from int, missing string) {
	if missing != "" && !c.SendWait([]byte(missing)) {
		return
	}
	// The first batch catches up (a resume's replay) and may wait for room;
	// after it a client that lets SendBuffer frames pile up is too slow and
	// is dropped.
	send := c.SendWait
	th := &thoughtMarks{}
	for {
		r.mu.Lock()
		n := len(r.events)
		evs, final, content, wake := r.events[from:n:n], r.final, r.content, r.wake
		r.mu.Unlock()
		for i, ev := range evs {
			if !c.sendToken(ev, from+i+1, th, send) {
				return
			}
		}
		from, send = n, c.sendNow
		if final != nil {
			if piece := th.close(); piece != "" && !send([]byte(piece)) {
				return
			}
			c.sendEnd(*final, content, r.reasoning())
			return
		}
		select {
		case <-wake:
		case <-c.Ctx.Done():
			return
		}
	}
}

// sendNow is sendRaw that reports whether the connection lives on.
func (c *conn) sendNow(b []byte) bool {
	c.SendRaw(b)
	return c.Ctx.Err() == nil
}

// sendToken sends one token event with its seq through send: in JSON mode a
// token message, or a thinking message for a piece of the thought; in text
// mode the answer's text, and the thought between its marks when the socket
// asked for it (th tracks them).
func (c *conn) sendToken(ev parley.Event, seq int, th *thoughtMarks, send func([]byte) bool) bool {
	if !c.json {
		for _, piece := range th.pieces(ev.Token, c.thinking) {
			if !send([]byte(piece)) {
				return false
			}
		}
		return true
	}
	if m, skip := serverToolFrame(ev, seq); m != nil || skip {
		if m == nil {
			return true
		}
		b, err := json.Marshal(m)
		return err == nil && send(b)
	}
	if ev.ToolCall != nil {
		b, err := json.Marshal(newToolCallMessage(*ev.ToolCall))
		if err != nil || !send(b) {
			return false
		}
	}
	msg := tokenMessage{Type: "token", ID: ev.Token.ID, Text: ev.Token.Text, Logprob: apicore.Finite(ev.Token.Logprob), Special: ev.Token.Special, Seq: seq}
	if ev.Token.Reasoning != "" {
		msg = tokenMessage{Type: "thinking", ID: ev.Token.ID, Text: ev.Token.Reasoning, Logprob: apicore.Finite(ev.Token.Logprob), Seq: seq}
	}
	b, err := json.Marshal(msg)
	if err != nil {
		c.Log.Error("encode message", zap.Error(err))
		return false
	}
	return send(b)
}

// sendEnd tells the client the reply ended: done (JSON) or the sentinel
// (text), or the error that ended it.
func (c *conn) sendEnd(final parley.Event, content, thinking string) {
	switch {
	case final.Finish == parley.FinishError:
		c.replyError(apicore.ErrOr(final.Err))
	case c.json:
		done := newDoneMessage(final, content)
		done.Thinking = thinking
		c.SendJSON(done)
	default:
		c.SendText(Sentinel)
	}
}

// greet sends a JSON-mode socket its session message: the history, and on
// a resume the reply in flight, which the socket then follows (rp). false:
// the resume failed; the socket is told and closing.
func (c *conn) greet(ctx context.Context, sess *session.Session, resumed bool, resumeFrom int) (rp *resumePoint, ok bool) {
	hist, live := history(sess.Messages), (*liveReplyJSON)(nil)
	if resumed {
		var err error
		if hist, live, rp, err = c.resume(ctx, resumeFrom); err != nil {
			c.Log.Info("resume failed", zap.Error(err))
			c.sendError(err)
			c.Close(apicore.CloseCode(err), "resume failed")
			return nil, false
		}
	}
	if c.json {
		c.SendJSON(sessionMessage{Type: "session", ID: sess.ID, Resumed: resumed, Model: sess.Model, Messages: hist, Reply: live})
	}
	return rp, true
}

// resume reads the history a resuming socket starts from, and the reply in
// flight it follows, if any. Replies of the session that are being
// cancelled or about to start are waited for (at most apicore.SettleWait), so the
// history is never one turn short: it holds every turn the server
// accepted, the one still generating marked so, and changes afterwards
// only by what the socket is then told (the reply's tokens and its end).
func (c *conn) resume(ctx context.Context, resumeFrom int) ([]historyMessage, *liveReplyJSON, *resumePoint, error) {
	c.waitSettled(ctx)
	for _, r := range c.srv.replies.of(c.id) {
		hist, live, rp, err := c.snapshot(ctx, r, resumeFrom)
		if err != nil || hist != nil {
			return hist, live, rp, err
		}
	}
	sess, _, err := c.srv.sessions.OpenModel(ctx, c.who(), c.id, "")
	if err != nil {
		return nil, nil, nil, err
	}
	return history(sess.Messages), nil, nil, nil
}

// waitSettled waits, at most apicore.SettleWait, until every reply in flight in the
// socket's session is settled (see liveReply.settled).
func (c *conn) waitSettled(ctx context.Context) {
	deadline := time.NewTimer(apicore.SettleWait)
	defer deadline.Stop()
	for _, r := range c.srv.replies.of(c.id) {
		for {
			ok, changed := r.settled()
			if ok {
				break
			}
			select {
			case <-changed:
				continue
			case <-ctx.Done():
			case <-deadline.C:
				c.Log.Warn("resume: a reply did not settle in time", zap.Duration("wait", apicore.SettleWait))
			}
			return
		}
	}
}

// snapshot reads the history past r when r is generating: the stored
// session, r's prompt and its text so far; c follows r from there. A nil
// history: r is not generating (the caller looks further).
func (c *conn) snapshot(ctx context.Context, r *liveReply, resumeFrom int) ([]historyMessage, *liveReplyJSON, *resumePoint, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.turn == nil || r.final != nil || r.cause != "" {
		return nil, nil, nil, nil
	}
	sess, pending, err := c.srv.sessions.Snapshot(ctx, c.who(), r.turn)
	if err != nil {
		return nil, nil, nil, err
	}
	hist := history(sess.Messages)
	if !pending {
		return hist, nil, nil, nil // stored already; its end is on its way to its own followers
	}
	seq := len(r.events)
	// The turn's own input (a regenerate's or a continue's prompt is the
	// conversation's, not the socket's), and a continue's text before
	// this reply's tokens.
	text := r.turn.Prefix() + textOf(r.events)
	in := r.turn.Input()
	if in.Role == "" {
		in = parley.Message{Role: parley.RoleUser, Content: r.prompt}
	}
	hist = append(hist,
		historyMessage{Message: in},
		historyMessage{Message: parley.Message{Role: parley.RoleAssistant, Content: text, Reasoning: reasoningOf(r.events)}, Status: "generating"})
	rp := &resumePoint{reply: r, from: seq}
	switch {
	case c.json && resumeFrom >= 0:
		rp.from = min(resumeFrom, seq)
	case !c.json:
		rp.missing = text[textStart(text, resumeFrom):]
	}
	rp.leave = r.followLocked(c.Ctx, c.cancelCause)
	c.Log.Info("resumed a reply in flight", zap.Int("seq", seq), zap.Int("from", rp.from))
	return hist, &liveReplyJSON{Status: "generating", Seq: seq}, rp, nil
}

// textStart is where text mode's missing text starts for a client that has
// n bytes of it (-1: none), backed up to a character boundary.
func textStart(text string, n int) int {
	n = min(max(n, 0), len(text))
	for n > 0 && n < len(text) && !utf8.RuneStart(text[n]) {
		n--
	}
	return n
}

// follow runs a resumed socket's resume point: the reply's rest, then the
// end. It runs on the worker, before any prompt the client sends next.
func (c *conn) followResumed(rp *resumePoint) {
	defer rp.leave()
	c.setTurn(rp.reply)
	defer c.clearTurn()
	c.stream(rp.reply, rp.from, rp.missing)
}

// history is the session message's view of stored messages.
func history(msgs []parley.Message) []historyMessage {
	h := make([]historyMessage, len(msgs))
	for i, m := range msgs {
		h[i] = historyMessage{Message: m}
	}
	return h
}
