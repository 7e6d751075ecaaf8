package apicore

// Several models in one server. With Models the request's model field (or
// a WebSocket's ?model=) picks the model: ResolveModel resolves it (an
// unknown name is a 404 naming the models served) and the handler keeps it
// in its request's Facts, which it passes to the helpers here. The
// Responder, which routes by it, and the session layer, which records it
// in a new session, are given it as an argument
// (parley.ReplyRequest.Model). Without Models the server serves one model
// and ignores the field.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// Models is the registry of the models a server serves when it serves
// several (cmd/parley adapts llm/registry to it).
type Models interface {
	// Resolve returns the served name that name stands for ("" is the
	// default model), or an ENotFound error that names the models served.
	Resolve(name string) (string, error)
	// Models reports every model, the default first.
	Models() []ModelStatus
	// Load loads a model now and waits until it is loaded.
	Load(ctx context.Context, name string) error
	// Unload unloads a model now, or when its replies in flight end
	// (then an EBusy error saying so).
	Unload(name string) error
}

// ModelStatus is one model as /v1/models, /health and Ollama's /api/tags
// and /api/ps show it.
type ModelStatus struct {
	Name      string           `json:"id"`
	State     string           `json:"state"` // unloaded, loading, loaded, unloading
	Default   bool             `json:"default,omitempty"`
	Pinned    bool             `json:"pinned,omitempty"`
	SizeBytes int64            `json:"size_bytes"` // the memory it takes loaded: file + KV cache (an estimate)
	KeepAlive string           `json:"keep_alive"` // how long it stays once idle ("forever" for pinned or negative)
	ExpiresAt *time.Time       `json:"expires_at,omitempty"`
	InFlight  int              `json:"replies_in_flight"`
	Waiting   int              `json:"waiting,omitempty"`
	Progress  float64          `json:"progress,omitempty"` // of a load in progress, 0 to 1
	LastError string           `json:"last_error,omitempty"`
	Settings  map[string]any   `json:"settings,omitempty"` // ctx, parallel, threads, gpu_layers, template, path
	Engine    string           `json:"engine,omitempty"`   // the llama.cpp engine that runs it, while it is loaded (/info's engine)
	Info      parley.ModelInfo `json:"-"`                  // the GGUF's facts (from its header; device facts once loaded)
}

// ResolveModel is the served name of a request's model field ("" with one
// model), aliases (Alias) included; an unknown name is the registry's 404
// that names the models served.
func (k *Core) ResolveModel(name string) (string, error) {
	if k.Models == nil {
		return "", nil
	}
	n, err := k.Models.Resolve(name)
	if err != nil {
		if k.Alias != nil {
			if n2, ok := k.Alias(name); ok {
				return n2, nil
			}
		}
		return "", err
	}
	return n, nil
}

// ModelStatusOf is the named model's status (false when there is none).
func (k *Core) ModelStatusOf(name string) (ModelStatus, bool) {
	for _, m := range k.Models.Models() {
		if m.Name == name {
			return m, true
		}
	}
	return ModelStatus{}, false
}

// ModelFor is a request's model (Facts.Model, "" the default): its name
// as clients see it and its facts. With one model, the loaded model.
func (k *Core) ModelFor(model string) (string, parley.ModelInfo) {
	if k.Models != nil {
		name := model
		if name == "" {
			name, _ = k.Models.Resolve("")
		}
		m, _ := k.ModelStatusOf(name)
		return name, m.Info
	}
	var info parley.ModelInfo
	if k.ModelInfo != nil {
		info = k.ModelInfo()
	}
	name := info.Name
	if name == "" {
		name = "parley"
	}
	return name, info
}

// ModelName is the id clients see for a request's model (Facts.Model, ""
// the default): the loaded model's with one model.
func (k *Core) ModelName(model string) string {
	name, _ := k.ModelFor(model)
	return name
}

// The Responder and Tokenizer of a server with several models (cmd/parley's
// router) serve each request's model (Facts.Model); these are their per-request
// forms, which the helpers below prefer when they are there.
type (
	modelTokenizers interface {
		// TokenizerFor returns model's tokenizer, the model held
		// (loaded first if need be, else nil when it is not loaded)
		// until release.
		TokenizerFor(ctx context.Context, model string, load bool) (t Tokenizer, release func(), err error)
	}
	modelTemplates interface {
		TemplateFor(model string) chat.Template
	}
	modelCounters interface {
		CountTokensFor(ctx context.Context, req parley.ReplyRequest) (int, error)
	}
	// templater gives the chat template replies are rendered with
	// (*chat.Responder has it).
	templater interface {
		Template() chat.Template
	}
	// tokenCounter counts a conversation's prompt tokens as a reply to it
	// with p would (*chat.Responder satisfies it).
	tokenCounter interface {
		CountTokens(key string, msgs []parley.Message, p parley.Params) (int, error)
	}
)

// TokenizerFor is the tokenizer of model (nil when the server has none),
// held until release; ctx bounds a load.
func (k *Core) TokenizerFor(ctx context.Context, model string) (Tokenizer, func(), error) {
	return k.TokenizerOf(ctx, model, true)
}

// TokenizerOf is TokenizerFor that, without load, does not load model for
// it (nil when the model is not loaded).
func (k *Core) TokenizerOf(ctx context.Context, model string, load bool) (Tokenizer, func(), error) {
	if mt, ok := k.Tokenizer.(modelTokenizers); ok && k.Models != nil {
		return mt.TokenizerFor(ctx, model, load)
	}
	return k.Tokenizer, func() {}, nil
}

// TemplateFor is the chat template of model; false when the responder
// does not tell it.
func (k *Core) TemplateFor(model string) (chat.Template, bool) {
	if mt, ok := k.Responder.(modelTemplates); ok && k.Models != nil {
		return mt.TemplateFor(model), true
	}
	if t, ok := k.Responder.(templater); ok {
		return t.Template(), true
	}
	return nil, false
}

// CountTokens counts the prompt tokens of msgs for f's model; false when
// the responder cannot count.
func (k *Core) CountTokens(ctx context.Context, f Facts, key string, msgs []parley.Message, p parley.Params) (int, bool, error) {
	key = parley.ScopedKey(f.Scope, key) // the memo Reply keeps under the caller's scope
	if mc, ok := k.Responder.(modelCounters); ok && k.Models != nil {
		n, err := mc.CountTokensFor(ctx, parley.ReplyRequest{Key: key, Model: f.Model, Messages: msgs, Params: p})
		return n, true, err
	}
	tc, ok := k.Responder.(tokenCounter)
	if !ok {
		return 0, false, nil
	}
	n, err := tc.CountTokens(key, msgs, p)
	return n, true, err
}

// limitTokenizer is a Tokenizer that stops early (*llm.Engine): once ctx
// ends, and once the text is known to be over limit (it then returns the
// tokens found so far, more than limit).
type limitTokenizer interface {
	TokenizeLimit(ctx context.Context, text string, limit int) ([]int, error)
}

// CountPromptTokens refuses, with too_large, text plus extra tokens (one
// per message: the role marker every template writes) over
// MaxPromptTokens; with text "" it counts only the messages, without a
// tokenizer (for a conversation whose rendered prompt the responder holds
// to the cap: parley.ReplyRequest.MaxPromptTokens). Without load, a prompt for a model that is not loaded
// is not counted (the WebSocket's reader must not wait for a load: the
// engine still refuses a prompt over the context). Tokenizing stops as
// soon as the text is over the limit, and when ctx ends (the client left).
// model is the request's (Facts.Model).
func (k *Core) CountPromptTokens(ctx context.Context, model, text string, extra int, load bool) error {
	_, err := k.countPromptTokens(ctx, model, text, extra, load)
	return err
}

// countPromptTokens is CountPromptTokens that returns text's tokens when it
// tokenized the whole text (nil when it did not tokenize it), so that a raw
// prompt is tokenized once.
func (k *Core) countPromptTokens(ctx context.Context, model, text string, extra int, load bool) ([]int, error) {
	limit := k.MaxPromptTokens
	if k.Tokenizer == nil || limit <= 0 {
		return nil, nil
	}
	if extra > limit {
		return nil, parley.Errorf(parley.ETooLarge, "the prompt has %d messages, each at least one token; at most %d tokens are accepted", extra, limit)
	}
	if text == "" {
		return nil, nil // a conversation, counted where it is rendered
	}
	// A token spans at least one byte of text, apart from the few a
	// tokenizer adds (BOS, EOS, SentencePiece's leading space): shorter
	// texts cannot be over the cap and are not tokenized.
	const added = 4
	if len(text)+added+extra <= limit {
		return nil, nil
	}
	tok, release, err := k.TokenizerOf(ctx, model, load)
	if err != nil || tok == nil {
		return nil, err
	}
	var toks []int
	if lt, ok := tok.(limitTokenizer); ok {
		toks, err = lt.TokenizeLimit(ctx, text, limit-extra)
	} else {
		toks, err = tok.Tokenize(text)
	}
	release()
	if err != nil {
		return nil, fmt.Errorf("count prompt tokens: %w", err)
	}
	if n := len(toks) + extra; n > limit {
		return nil, parley.PromptTooLong(n, limit, "the prompt is at least %d tokens; at most %d are accepted", n, limit)
	}
	return toks, nil
}

// PromptText is every string of msgs and tools that reaches the prompt
// (contents, reasoning, names, tool calls, tool definitions), one per line,
// for CountPromptTokens: what the template adds around them is counted as
// one token per message.
func PromptText(msgs []parley.Message, tools []parley.Tool) string {
	var b strings.Builder
	line := func(s string) {
		if s != "" {
			b.WriteString(s)
			b.WriteByte('\n')
		}
	}
	for _, m := range msgs {
		line(m.Content)
		line(m.Reasoning)
		line(m.Name)
		line(m.ToolCallID)
		for _, c := range m.ToolCalls {
			line(c.ID)
			line(c.Name)
			line(c.Arguments)
		}
	}
	for _, t := range tools {
		line(t.Name)
		line(t.Description)
		line(string(t.Parameters))
	}
	return b.String()
}
