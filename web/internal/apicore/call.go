package apicore

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// Every stateless API decodes its sampling parameters with ParamsPatch and
// validates them with ResolveParams, so a bad value is the same 400 naming
// the field whatever the wire. Errors before the first byte of a reply are
// JSON errors with the mapped status; errors after it are the format's own
// final error event. The request's context is the reply's: a client that
// goes away cancels its generation within one decode step.

// Call is one API request's reply in flight.
type Call struct {
	core   *Core
	Route  string
	Cancel context.CancelFunc // cancels the reply (its context is the request's, which ends when the client goes away)
	Rep    parley.Reply
	Params parley.Params
	meter  Meter // metrics: every event of the reply passes through it
	// TopLogprobs is how many top_logprobs an OpenAI client asked for.
	TopLogprobs int
	// OnTool makes a streamed tool-call delta's chunk (nil: the wire has
	// none); Tool, set by the stream, sends it. Relay calls Tool before the
	// token of the event that carries the delta.
	OnTool func(d parley.ToolCallDelta) any
	Tool   func(d parley.ToolCallDelta) error
}

// StartCompletion starts a raw-prompt reply (no template) for route.
//
// The reply names its affinity key in X-Parley-Session (CompletionAffinity).
func (k *Core) StartCompletion(c echo.Context, f Facts, route, prompt string, p parley.Params) (*Call, error) {
	SetAffinity(c, CompletionAffinity(f.Caller.User, SentAffinityKey(c, f), prompt))
	return k.StartCall(c, f, route, prompt, 0, p, func(ctx context.Context, r parley.Responder, req parley.ReplyRequest) (parley.Reply, error) {
		// req.PromptTokens, when StartCall counted them, are the prompt's:
		// the responder takes them rather than tokenizing it again.
		req.Prompt = prompt
		return r.Complete(ctx, req)
	})
}

// StartChat starts a reply to a conversation rendered with the model's template.
// The whole prompt (every message and tool, and what the template adds) is
// held to MaxPromptTokens by the responder, which tokenizes the rendered
// prompt once, stopping as soon as it is over the cap, and decodes those
// tokens. Here only the messages are counted (each is at least its role
// marker), which needs no tokenizer, unless the conversation's text is
// counted first (see CountedText): a conversation within the cap is
// tokenized once.
//
// The reply names the conversation's affinity key in X-Parley-Session: the
// client's own (SentAffinityKey), or one derived from its user and the
// conversation's opening (parley.AffinityKey), so a balancer that hashes on
// the header keeps a resent conversation on the replica that holds its cache.
func (k *Core) StartChat(c echo.Context, f Facts, route, key string, msgs []parley.Message, p parley.Params) (*Call, error) {
	SetAffinity(c, parley.AffinityKey(f.Caller.User, SentAffinityKey(c, f), msgs))
	return k.StartCall(c, f, route, CountedText(msgs, p.Tools, k.MaxPromptTokens), len(msgs), p, func(ctx context.Context, r parley.Responder, req parley.ReplyRequest) (parley.Reply, error) {
		if k.MaxPromptTokens > 0 && k.Tokenizer != nil {
			req.MaxPromptTokens = k.MaxPromptTokens
		}
		req.Key, req.Messages = key, msgs
		req.PromptTokens = nil // the counted text's, not a prompt's
		return r.Reply(ctx, req)
	})
}

// countedBytesPerToken is the bytes per token of the cap past which the
// edge counts a conversation's text before the responder renders it. Real
// text averages 2 to 5 bytes a token; a text longer than this many bytes
// per token of the cap is almost surely over it, and counting it here, up
// to the cap's tokens, refuses a huge one (megabytes of tools) without
// rendering it. Only a text within the cap whose tokens average more bytes
// than this (long runs of spaces) is then tokenized twice.
const countedBytesPerToken = 8

// CountedText is the text of a conversation that the edge counts against
// the cap maxPrompt (<= 0: none) before the responder renders it: "" (only
// the messages are counted; the responder counts the rendered prompt and
// stops at the cap) unless the text (PromptText) is longer than
// countedBytesPerToken bytes per token of the cap, or the conversation has
// images, whose prompt the responder tokenizes whole (images and text
// together, with no early stop).
func CountedText(msgs []parley.Message, tools []parley.Tool, maxPrompt int) string {
	if maxPrompt <= 0 {
		return ""
	}
	return CountedPromptText(PromptText(msgs, tools), parley.ImageCount(msgs) > 0, maxPrompt)
}

// CountedPromptText is CountedText for a conversation whose text (every
// string that reaches its prompt) is text: text when it has images or is
// longer than countedBytesPerToken bytes per token of the cap, else "".
func CountedPromptText(text string, images bool, maxPrompt int) string {
	if maxPrompt > 0 && (images || len(text) > maxPrompt*countedBytesPerToken) {
		return text
	}
	return ""
}

// StartCall starts a reply for route once the server takes work and the
// request's text (a raw prompt; "" when the responder counts the prompt
// itself) plus extra tokens (one per message) is within MaxPromptTokens.
// start is given the request with f's caller, model, keep-alive and scope
// and p, and in
// PromptTokens text's tokens when counting it tokenized the whole text (nil
// otherwise); it adds what it answers.
func (k *Core) StartCall(c echo.Context, f Facts, route, text string, extra int, p parley.Params, start func(context.Context, parley.Responder, parley.ReplyRequest) (parley.Reply, error)) (*Call, error) {
	if err := k.Available(); err != nil {
		return nil, err
	}
	counted, err := k.countPromptTokens(c.Request().Context(), f.Model, text, extra, true)
	if err != nil {
		return nil, err
	}
	// These APIs store nothing: the engine keeps no copy of their KV state
	// beyond the slot (a conversation key only leads a resent conversation
	// back to its slot).
	ctx, cancel := context.WithCancel(c.Request().Context())
	model, who := f.Model, f.Caller
	req := parley.ReplyRequest{Model: model, KeepAlive: f.KeepAlive, Client: who.Client, User: who.User, Scope: f.Scope, Stateless: true, Params: p, PromptTokens: counted}
	if k.Models != nil && strings.HasSuffix(route, "-stream") {
		req.LoadProgress = k.SSEProgress(c)
	}
	call := &Call{core: k, Route: route, Cancel: cancel, Params: p, meter: k.Meter(model)}
	rep, err := start(ctx, k.Responder, req)
	if err != nil && c.Request().Context().Err() != nil && errors.Is(err, context.Canceled) {
		// The client left while its prompt was rendered or tokenized:
		// not a failure of the server's.
		err = parley.Errorf(parley.EUnavailable, "the request was cancelled before its reply started")
	}
	if err != nil {
		cancel()
		if c.Response().Committed { // the stream began with load progress: end it with the error
			k.SSEError(c, err)
		}
		k.Log.Info("reply refused", zap.String("route", route),
			zap.String("code", parley.ErrorCode(err)), zap.String("reason", parley.ErrorMessage(err)))
		return nil, err
	}
	call.Rep = rep
	return call, nil
}

// Relay passes the reply's events to the wire in order: token for each token
// event (index counts tokens from 1), final for the last event. When a token
// is known to be the last one (it reaches the reply cap, so the final event
// follows at once) it is held and given to final as last, so formats that
// mark the last token's own line or event with the finish reason can; in
// every other case last is nil and the format writes an end marker of its
// own. A write error (the client went away) cancels generation and ends the
// relay: after cancelling, the reply need not be drained.
//
// Relay always returns with the reply either finished or cancelled.
func (a *Call) Relay(token func(t parley.Token, index int) error, final func(last *parley.Token, ev parley.Event) error) error {
	defer a.Cancel()
	n := 0
	var held *parley.Token
	for ev := range a.Rep.Events() {
		a.meter.Observe(ev)
		if ev.Done {
			a.logReply(ev)
			return final(held, ev)
		}
		n++
		if ev.ToolCall != nil && a.Tool != nil {
			if err := a.Tool(*ev.ToolCall); err != nil {
				a.Cancel()
				a.Drain()
				return err
			}
		}
		if n == a.Params.MaxTokens {
			t := ev.Token
			held = &t
			continue
		}
		if err := token(ev.Token, n); err != nil {
			// The client went away: stop generating, and drain (quickly:
			// a cancelled reply delivers only its final event) to log it.
			a.Cancel()
			a.Drain()
			return err
		}
	}
	// Unreachable by the Reply's contract (one Done event ends every stream).
	return chat.ErrNoFinalEvent
}

// Drain reads what is left of a cancelled reply (quickly: it delivers only
// its final event) to log it.
func (a *Call) Drain() {
	for ev := range a.Rep.Events() {
		a.meter.Observe(ev)
		if ev.Done {
			a.logReply(ev)
		}
	}
}

// Collect reads the whole reply, for the non-streaming forms. It returns
// the token events and the final event.
func (a *Call) Collect() ([]parley.Token, parley.Event) {
	defer a.Cancel()
	var toks []parley.Token
	for ev := range a.Rep.Events() {
		a.meter.Observe(ev)
		if ev.Done {
			a.logReply(ev)
			return toks, ev
		}
		toks = append(toks, ev.Token)
	}
	return toks, parley.Event{Done: true, Finish: parley.FinishError, Err: chat.ErrNoFinalEvent}
}

// logReply writes the reply's log line (ReplyLog) with its route first and
// its seed, when the request fixed one.
func (a *Call) logReply(ev parley.Event) {
	var seed []zap.Field
	if a.Params.Seed >= 0 {
		seed = append(seed, zap.Int64("seed", a.Params.Seed))
	}
	ReplyLog(a.core.Log.With(zap.String("route", a.Route)), ev, seed...)
}

// SettleWait bounds how long a client waits for a reply that is being
// cancelled, or about to start, to settle before its history is read (a
// resuming chat client, a background response's cancel). A cancelled reply
// ends within one engine step (chat's abandonAfter, 1 s, bounds a stuck
// one).
const SettleWait = 3 * time.Second

// ReplyError is the error a reply that did not finish normally reports on
// the wire: the engine's error, or, for a reply cancelled while its client
// is still there, the server's shutdown. nil for a normal finish.
func ReplyError(ev parley.Event) error {
	switch ev.Finish {
	case parley.FinishError:
		return ErrOr(ev.Err)
	case parley.FinishCancelled:
		return parley.Errorf(parley.EUnavailable, "the reply was cancelled: the server is shutting down")
	}
	return nil
}

// ReplyLog writes the one log line every reply gets, whatever its route or
// mode (the WebSocket chat and every HTTP API): how it finished, its token
// counts and its timings, then extra (e.g. the seed), then the error if any.
func ReplyLog(log *zap.Logger, ev parley.Event, extra ...zap.Field) {
	fields := append([]zap.Field{
		zap.String("finish", string(ev.Finish)),
		zap.Int("prompt_tokens", ev.Usage.PromptTokens),
		zap.Int("cached_prompt_tokens", ev.Usage.CachedPromptTokens),
		zap.Int("reply_tokens", ev.Usage.CompletionTokens),
		zap.Duration("ttft", ev.Timings.TimeToFirstToken),
		zap.Float64("tokens_per_second", Round2(ev.Timings.TokensPerSecond(ev.Usage.CompletionTokens))),
		zap.Duration("total", ev.Timings.Total),
	}, extra...)
	if ev.Err != nil {
		fields = append(fields, zap.Error(ev.Err))
	}
	log.Info("reply", fields...)
}
