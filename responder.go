package parley

import (
	"context"
	"time"
)

// ReplyRequest is what a reply is asked for with. Every fact about the
// request that a layer below the wire acts on is a field here, so that the
// Responder's callers (the session layer, the HTTP APIs) and its
// implementations (chat's one model, the router's several) agree on it in
// one place.
type ReplyRequest struct {
	// Key ties the request to a KV-cache slot across requests (a session
	// id); "" is a stateless request. It is taken within the request's
	// cache scope (ScopedKey of CacheScope).
	Key string
	// User is the user the request acts for (the name its API key maps
	// to; "" is the one anonymous user of a server without named users).
	User string
	// Scope is the request's cache scope (see UserCacheScope): the part of
	// the engine's caches it may use. "" is User's own (CacheScope), so a
	// request that names no scope never shares another user's caches.
	Scope string
	// Model names the model to answer with, when a server serves several:
	// a router picks the model by it. "" is the default model; a
	// Responder over one model ignores it.
	Model string
	// KeepAlive, when set, asks to keep the model loaded for that long
	// after the reply ends (Ollama's keep_alive): 0 unloads it at once, a
	// negative duration keeps it until it is unloaded by hand. nil leaves
	// the model's own. What a request may change is the server's policy.
	KeepAlive *time.Duration
	// Client names the client the request comes from (see
	// GenerateRequest.Client): the engine queues and caps per client.
	Client string
	// Stateless marks a request that belongs to no stored conversation (a
	// stateless API's chat, an unstored Responses turn): its key, if any,
	// only leads it to the slot that holds its prefix, and the engine keeps
	// no copy of its KV state once the slot goes to another request (no KV
	// swap, no disk).
	Stateless bool
	// LoadProgress, when set, is shown the progress of the model load the
	// request waits for, if it waits for one (a router loading req.Model).
	LoadProgress LoadProgress
	// Messages is the conversation a Reply answers: the system prompt
	// (when there is one) first, ending with the user's message (or a tool
	// result). Complete ignores it.
	Messages []Message
	// MaxPromptTokens caps the tokens of the whole prompt Reply renders
	// (every message and tool, and what the template writes around them,
	// before older turns are dropped to fit the context): over it the reply
	// is refused with ETooLarge (PromptTooLong). <= 0 means no cap.
	MaxPromptTokens int
	// Continue asks Reply to carry on the conversation's last message, an
	// assistant reply cut short (its length limit, a stop), instead of
	// starting a new reply after it: the reply's text is the prompt's end,
	// and the new tokens carry it on. Complete ignores it.
	Continue bool
	// Prompt is the raw prompt a Complete carries on: no template, no
	// history. Reply ignores it.
	Prompt string
	// PromptTokens are Prompt's tokens (as the model's Tokenize makes
	// them), when the caller has them already: Complete then does not
	// tokenize the prompt again. nil: Complete tokenizes it.
	PromptTokens []int
	// Params are the reply's sampling parameters, validated by the caller
	// (the wire's edge, or the session's stored ones).
	Params Params
}

// CacheScope is the request's cache scope: Scope, else its User's.
func (r ReplyRequest) CacheScope() string {
	if r.Scope != "" {
		return r.Scope
	}
	return UserCacheScope(r.User)
}

// Reply is one reply being generated. Events yields token events, then
// exactly one event with Done set (finish reason, usage, timings), then is
// closed; the final event always fits in the channel's buffer, so after
// cancelling the request's context a reader may stop early. The other
// methods describe the reply; Text, Reasoning and StopSequence are whole
// once the final event has been read.
type Reply interface {
	Events() <-chan Event
	// Done is closed when the reply has ended (its final event is in
	// Events, and the engine has let go of the request): a model the reply
	// runs on may be unloaded from then on.
	Done() <-chan struct{}
	Text() string         // the cleaned reply delivered so far
	Reasoning() string    // a reasoning model's thought delivered so far, apart from Text
	Prompt() string       // the rendered prompt generation started from
	PromptTokens() int    // its tokens
	Dropped() int         // the oldest messages left out to fit the context
	StopSequence() string // the stop string that ended the reply ("" unless its finish is FinishStop)
}

// Responder produces replies; it is the one contract between the layers
// that hold requests (sessions, the HTTP APIs) and the one that renders,
// tokenizes and generates (chat over the engine, or a router over several).
// Both methods return at once: with an error (a parley *Error where the
// request is at fault) when the reply cannot start, or with the reply
// streaming. The caller must read Events until it is closed or cancel ctx.
type Responder interface {
	// Reply answers req.Messages, rendered with the model's chat template.
	Reply(ctx context.Context, req ReplyRequest) (Reply, error)
	// Complete carries on req.Prompt as it is.
	Complete(ctx context.Context, req ReplyRequest) (Reply, error)
}
