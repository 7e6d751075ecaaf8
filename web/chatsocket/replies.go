package chatsocket

// A chat reply outlives its socket for a while: when the socket drops
// mid-reply the reply goes on for Config.ResumeGrace with its tokens kept,
// and a client that resumes the session within it picks the reply back up
// (the tokens it missed, then the rest). Each reply is a liveReply: one
// pump goroutine reads the turn's events into a log, and every socket that
// follows the reply (the one that asked, one that resumed) reads the log
// from its own position. Nothing waits on a follower, so a slow or gone
// client never holds up the engine.

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// DefaultResumeBuffer is Config.ResumeBuffer's default: tokens a reply may
// generate while no client follows it.
const DefaultResumeBuffer = 4096

// replyRegistry holds the chat replies in flight, by session id.
type replyRegistry struct {
	mu sync.Mutex
	m  map[string]map[*liveReply]struct{}
	wg sync.WaitGroup // one per registered reply, done when it has ended
}

// liveReply is one chat reply in flight. Its log holds every token event
// of the reply (at most its max_tokens, which the server caps); while no
// socket follows it, it may generate Config.ResumeBuffer tokens and live
// Config.ResumeGrace before it is cancelled.
type liveReply struct {
	srv    *Chat
	sid    string
	prompt string
	log    *zap.Logger
	ctx    context.Context // the turn's: the server's, not a socket's
	cancel context.CancelFunc
	hold   *admission // the client's admission, held until the reply ends
	model  string     // the session's model, with several models (metrics)

	mu        sync.Mutex
	turn      *session.Turn  // nil until the turn started
	events    []parley.Event // token events in order; events[i] has seq i+1
	final     *parley.Event  // the final event, once the reply ended
	content   string         // the whole reply, with final
	followers int            // sockets following the reply now
	unheard   int            // tokens generated since the last follower left
	grace     *time.Timer    // running while nobody follows
	cause     string         // why the reply was cancelled ("" while it was not)
	wake      chan struct{}  // closed and replaced on every change
	ended     chan struct{}  // closed when the reply has ended (or never started)
	endOnce   sync.Once
}

// open registers a new reply to prompt for c's session, on the server's
// context (not c's), holding c's admission until it ends. The caller
// follows it (see follow) and ends it with fail or through its pump.
func (g *replyRegistry) open(c *conn, prompt string) *liveReply {
	ctx, cancel := context.WithCancel(c.srv.stop)
	r := &liveReply{srv: c.srv, sid: c.id, prompt: prompt, log: c.Log, ctx: ctx, cancel: cancel, hold: c.hold,
		wake: make(chan struct{}), ended: make(chan struct{})}
	r.hold.add()
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[string]map[*liveReply]struct{})
	}
	if g.m[r.sid] == nil {
		g.m[r.sid] = make(map[*liveReply]struct{})
	}
	g.m[r.sid][r] = struct{}{}
	g.wg.Add(1)
	g.mu.Unlock()
	return r
}

// of returns the replies in flight in session sid.
func (g *replyRegistry) of(sid string) []*liveReply {
	g.mu.Lock()
	defer g.mu.Unlock()
	var rs []*liveReply
	for r := range g.m[sid] {
		rs = append(rs, r)
	}
	return rs
}

// running counts the replies still generating (Close drains them).
func (g *replyRegistry) running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, set := range g.m {
		n += len(set)
	}
	return n
}

func (g *replyRegistry) remove(r *liveReply) {
	g.mu.Lock()
	delete(g.m[r.sid], r)
	if len(g.m[r.sid]) == 0 {
		delete(g.m, r.sid)
	}
	g.mu.Unlock()
}

// end unregisters r and releases what it held; the first call wins.
func (r *liveReply) end() {
	r.endOnce.Do(func() {
		r.mu.Lock()
		if r.grace != nil {
			r.grace.Stop()
		}
		r.mu.Unlock()
		r.srv.replies.remove(r)
		r.cancel()
		close(r.ended)
		// The end is a change too: a resume waiting for r to settle (a
		// cancelled reply settles when it ends) wakes now, not at the end
		// of its wait. ended is closed first, so the waiter sees it.
		r.mu.Lock()
		r.broadcastLocked()
		r.mu.Unlock()
		r.hold.done()
		r.srv.replies.wg.Done()
	})
}

// fail ends a reply whose turn never started (refused, or its socket gone).
func (r *liveReply) fail() { r.end() }

// broadcastLocked wakes every follower; r.mu is held.
func (r *liveReply) broadcastLocked() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// stop cancels the reply now; cause says who (for the metric and the log).
func (r *liveReply) stop(cause string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked(cause)
}

func (r *liveReply) stopLocked(cause string) {
	if r.cause != "" || r.final != nil {
		return
	}
	r.cause = cause
	r.cancel()
	r.broadcastLocked()
}

// cancelCause is the cancel cause the reply's meter records.
func (r *liveReply) cancelCause() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cause == "" {
		return r.srv.requestCancelCause()
	}
	return r.cause
}

// start hands r its turn and starts the pump that reads it.
func (r *liveReply) start(turn *session.Turn) {
	r.mu.Lock()
	r.turn = turn
	r.broadcastLocked()
	r.mu.Unlock()
	go r.pump()
}

// pump reads the turn's events into the log until the reply ends. It never
// waits on a follower.
func (r *liveReply) pump() {
	defer r.end()
	meter := r.srv.hooks.Meter(r.cancelCause, r.model)
	for ev := range r.turn.Events() {
		meter.Observe(ev)
		r.mu.Lock()
		if ev.Done {
			r.final, r.content = &ev, r.turn.Text()
			// The turn settled before its final event was sent: counted
			// before any follower hears the end (tests read it right after).
			if r.turn.Committed() {
				r.srv.hooks.CountTurn(r.turn.KVCache())
			}
		} else {
			r.events = append(r.events, ev)
			if r.followers == 0 {
				r.unheard++
				if r.unheard > r.srv.cfg.ResumeBuffer {
					r.log.Info("reply cancelled: nobody resumed it before its buffer filled", zap.Int("tokens", r.unheard))
					r.stopLocked(apicore.CancelByDisconnect)
				}
			}
		}
		r.broadcastLocked()
		r.mu.Unlock()
		if ev.Done {
			apicore.ReplyLog(r.log, ev, zap.Int("seq", len(r.events)))
		}
	}
}

// follow adds a follower to r and returns leave, which removes it (once):
// call it when the follower is done with the reply. It also runs when ctx
// (the follower's socket) ends: with nobody left, the reply is cancelled
// at once (ResumeGrace 0; cause says who ended the socket) or after the
// grace.
func (r *liveReply) follow(ctx context.Context, cause func() string) (leave func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.followLocked(ctx, cause)
}

// followLocked is follow with r.mu held.
func (r *liveReply) followLocked(ctx context.Context, cause func() string) (leave func()) {
	r.followers++
	r.unheard = 0
	if r.grace != nil {
		r.grace.Stop()
		r.grace = nil
	}
	var once sync.Once
	gone := func() { once.Do(func() { r.unfollow(cause) }) }
	stop := context.AfterFunc(ctx, gone) // runs in its own goroutine: never under r.mu
	return func() {
		stop()
		gone()
	}
}

// unfollow removes a follower; the last one to leave a running reply starts
// its grace (or cancels it, without one).
func (r *liveReply) unfollow(cause func() string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.followers--; r.followers > 0 || r.final != nil || r.cause != "" {
		return
	}
	grace := r.srv.cfg.ResumeGrace
	if grace <= 0 {
		r.stopLocked(cause())
		return
	}
	r.log.Info("reply goes on without its client", zap.Duration("grace", grace), zap.Int("seq", len(r.events)))
	r.grace = time.AfterFunc(grace, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.followers == 0 && r.final == nil && r.cause == "" {
			r.log.Info("reply cancelled: nobody resumed it within the grace", zap.Duration("grace", grace))
			r.stopLocked(apicore.CancelByDisconnect)
		}
	})
}

// settled reports whether a resuming client may read the history past r:
// r has ended, or it runs (started, not cancelled) and will show as in
// flight. Also the channel to wait on for a change.
func (r *liveReply) settled() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.ended:
		return true, nil
	default:
	}
	return r.turn != nil && r.cause == "" && r.final == nil, r.wake
}

// reasoning is the reply's whole thought so far ("" before its turn began).
func (r *liveReply) reasoning() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.turn == nil {
		return ""
	}
	return r.turn.Reasoning()
}

// textOf is the reply text of token events.
func textOf(evs []parley.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.Token.Text)
	}
	return b.String()
}

// reasoningOf is the thought text of token events (a reasoning model's).
func reasoningOf(evs []parley.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.Token.Reasoning)
	}
	return b.String()
}

// admission is a client's admission (see Server.admit), released when the
// last of its holders is done: the socket, and every reply it started,
// so a reply that outlives its socket still counts against the client's
// and the server's connection caps.
type admission struct {
	mu      sync.Mutex
	n       int
	release func()
}

func newAdmission(release func()) *admission { return &admission{n: 1, release: release} }

func (a *admission) add() {
	a.mu.Lock()
	a.n++
	a.mu.Unlock()
}

func (a *admission) done() {
	a.mu.Lock()
	a.n--
	last := a.n == 0
	a.mu.Unlock()
	if last {
		a.release()
	}
}
