package chatsocket

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/wsock"
	"go.uber.org/zap"
)

// Sessions is what the chat socket needs from the session layer.
type Sessions interface {
	// OpenModel starts a session held with model, or resumes session id.
	OpenModel(ctx context.Context, who parley.Caller, id, model string) (*session.Session, bool, error)
	// Snapshot reads a turn's session ordered against its commit (see
	// session.Service.Snapshot): a resume never shows a stale history.
	Snapshot(ctx context.Context, who parley.Caller, t *session.Turn) (*session.Session, bool, error)
	Turn(ctx context.Context, who parley.Caller, id, prompt string, p parley.Params, opts ...session.TurnOption) (*session.Turn, error)
	Reset(ctx context.Context, who parley.Caller, id string) error
	SetSystem(ctx context.Context, who parley.Caller, id, text string) error
}

// Sentinel is the text-mode end-of-reply message.
const Sentinel = "<<Response Finished>>"

// Settings are the chat socket's bounds, from the server's configuration.
type Settings struct {
	Defaults        parley.Params // sampling defaults
	MaxTokensCap    int           // the largest max_tokens a client may ask for
	MaxMessageBytes int64         // per message; over it the connection closes with 1009
	// MaxImageMessageBytes is the most a JSON-mode message that carries
	// images may be (MaxMessageBytes for the rest of it, plus the most
	// bytes the image limits let a prompt's images take as data: URLs);
	// <= MaxMessageBytes: images get no more room than text. A message
	// over its cap is answered with an error and the connection lives on.
	MaxImageMessageBytes int64
	PromptsPerMinute     int // per connection; over it prompts are refused with rate_limited
	MaxQueuedPrompts     int // prompts and control messages waiting behind the running reply
	// ResumeGrace is how long a reply goes on after its socket drops, its
	// tokens kept for a client that resumes the session (resume.go).
	ResumeGrace time.Duration
	// ResumeBuffer bounds the tokens a reply may generate while no client
	// follows it.
	ResumeBuffer int
}

// Hooks are the server's metrics and scopes, as the chat socket uses them.
type Hooks struct {
	Refused      func(cause string) // counts one refusal under cause
	CountRefusal func(err error)    // counts err if it is a refusal
	// CacheScope is the KV-cache scope of user's client.
	CacheScope func(user, client string) string
	// Meter starts the metrics of one reply of model; cancelCause says
	// who cancelled it.
	Meter func(cancelCause func() string, model string) apicore.Meter
	// CountTurn counts a committed turn under its KV cache state.
	CountTurn func(kvState string)
}

// Chat is the chat WebSocket: the page's and any client's conversation
// over one socket per session, its replies resumable after a drop.
type Chat struct {
	core     *apicore.Core
	sockets  wsock.Lifecycle
	sessions Sessions
	cfg      Settings
	hooks    Hooks
	log      *zap.Logger
	stop     context.Context // the server's: parents every connection and reply
	draining *atomic.Bool    // the server's: set once its drain begins
	models   apicore.Models  // several models; nil: one
	replies  replyRegistry   // replies in flight (replies.go)
}

// New returns the chat socket over the server's core, sockets and
// sessions. stop parents every connection and reply; draining is set once
// the server drains.
func New(core *apicore.Core, sockets wsock.Lifecycle, sessions Sessions, cfg Settings, hooks Hooks, stop context.Context, draining *atomic.Bool) *Chat {
	return &Chat{core: core, sockets: sockets, sessions: sessions, cfg: cfg, hooks: hooks, log: core.Log,
		stop: stop, draining: draining, models: core.Models}
}

// Running is the number of replies in flight, with or without a socket,
// which the server's drain waits for.
func (s *Chat) Running() int { return s.replies.running() }

// Wait waits for every reply to end and store its turn.
func (s *Chat) Wait() { s.replies.wg.Wait() }

func (s *Chat) refused(cause string)                  { s.hooks.Refused(cause) }
func (s *Chat) countRefusal(err error)                { s.hooks.CountRefusal(err) }
func (s *Chat) cacheScope(user, client string) string { return s.hooks.CacheScope(user, client) }

// requestCancelCause is the cancel cause of a reply that has no socket to
// ask: it lost its client, or the server is shutting down.
func (s *Chat) requestCancelCause() string {
	if s.draining.Load() {
		return apicore.CancelByShutdown
	}
	return apicore.CancelByDisconnect
}
