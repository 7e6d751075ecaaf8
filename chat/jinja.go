package chat

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// NameJinja is the name of a template rendered from Jinja source (the GGUF's tokenizer.chat_template or a file).
const NameJinja = "jinja"

// Jinja is a Template that renders a Jinja chat template, as Hugging Face's apply_chat_template does, through a
// JinjaRenderer (a Sandbox for a GGUF's template). When a render fails (the template raises, or exceeds its
// limits) the conversation is rendered with the fallback family instead, and the failure is logged.
type Jinja struct {
	src      string
	toolUse  string // the tool_use variant, rendered when a request has tools ("": src renders them)
	renderer JinjaRenderer
	bos, eos string
	fallback Template
	log      *zap.Logger
	now      func() time.Time
	stops    []string
	// thinkingKey: the template reads the thought as message.thinking (gpt-oss) rather than reasoning_content.
	thinkingKey bool
	think       ThinkFormat
	// imageOnce finds imageTextV, what the template writes for an image part (jinja_images.go).
	imageOnce  sync.Once
	imageTextV string
}

// JinjaConfig configures a Jinja template.
type JinjaConfig struct {
	Renderer JinjaRenderer // nil: in process (trusted templates only)
	BOSToken string        // the model's BOS text; a rendered prompt's leading BOS is removed (the tokenizer adds it)
	EOSToken string
	// Fallback renders when the template fails; nil: the family DetectTemplate finds in the source.
	Fallback Template
	Log      *zap.Logger
	// Now is strftime_now's clock; nil: time.Now.
	Now func() time.Time
	// ToolUse is the model's tool_use variant (tokenizer.chat_template.tool_use), rendered for requests with tools.
	ToolUse string
}

// NewJinja returns the template for src without trying it (see LoadJinja, which does).
func NewJinja(src string, cfg JinjaConfig) *Jinja {
	t := &Jinja{src: src, toolUse: cfg.ToolUse, renderer: cfg.Renderer, bos: cfg.BOSToken, eos: cfg.EOSToken, fallback: cfg.Fallback,
		log: cfg.Log, now: cfg.Now}
	if t.renderer == nil {
		t.renderer = &InProcess{}
	}
	if t.fallback == nil {
		t.fallback = DetectTemplate(src)
	}
	if t.log == nil {
		t.log = zap.NewNop()
	}
	if t.now == nil {
		t.now = time.Now
	}
	t.thinkingKey = strings.Contains(src, ".thinking")
	t.think = DetectThinkFormat(src)
	t.stops = jinjaStops(src, t.fallback, cfg.EOSToken, t.think)
	return t
}

// endOfTurnMarkers are the end-of-turn texts of the template formats Parley knows; those a template writes become
// its stop strings (for a model that spells one out instead of sampling its token).
var endOfTurnMarkers = []string{
	"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|return|>", "<|endoftext|>",
	"<｜end▁of▁sentence｜>", "<|END_OF_TURN_TOKEN|>", "<turn|>",
}

func jinjaStops(src string, fallback Template, eos string, think ThinkFormat) []string {
	var stops []string
	add := func(s string) {
		for _, x := range stops {
			if x == s {
				return
			}
		}
		stops = append(stops, s)
	}
	if fallback.Name() != NamePlain {
		for _, s := range fallback.Stops() {
			add(s)
		}
	}
	for _, m := range endOfTurnMarkers {
		// A harmony reply's messages end with <|end|> before the final one: only <|return|> and <|call|> end it.
		if strings.Contains(src, m) && (think != ThinkHarmony || m != harmonyEnd) {
			add(m)
		}
	}
	if think == ThinkHarmony {
		add(harmonyCall)
	}
	if eos != "" && len(eos) > 1 {
		add(eos)
	}
	return stops
}

// Name implements Template.
func (t *Jinja) Name() string { return NameJinja }

// Stops implements Template.
func (t *Jinja) Stops() []string { return append([]string(nil), t.stops...) }

// ThinkFormat returns how the model marks its thought, detected from the template (ThinkNone: no thought).
func (t *Jinja) ThinkFormat() ThinkFormat { return t.think }

// Source returns the template's Jinja source.
func (t *Jinja) Source() string { return t.src }

// Fallback returns the family that renders when the template fails.
func (t *Jinja) Fallback() Template { return t.fallback }

// Render implements Template. Unlike the families, a Jinja template may rewrite earlier turns (most reasoning
// templates drop earlier thoughts), so a rendered history is not always a prefix of the next turn's prompt.
func (t *Jinja) Render(msgs []parley.Message, opt RenderOptions) (string, error) {
	if usesTools(msgs, opt) && !t.rendersTools() {
		// A template that knows no tools would drop them (and the calls and results in the history) silently: the
		// family it belongs to renders them in its own tool format instead.
		return t.fallback.Render(msgs, opt)
	}
	out, err := t.RenderJinja(msgs, opt)
	if err == nil {
		return out, nil
	}
	var perr *parley.Error
	if errors.As(err, &perr) {
		return "", err // the request's fault (a bad role, bad tool JSON): the fallback would refuse it too
	}
	t.log.Warn("the chat template failed; rendering with the fallback family",
		zap.String("fallback", t.fallback.Name()), zap.Error(err))
	if t.imageText() != "" {
		msgs = withImageMarkers(msgs) // the fallback takes images as marker lines
	}
	return t.fallback.Render(msgs, opt)
}

// rendersTools reports whether the template (or its tool_use variant) reads the tools and tool turns.
func (t *Jinja) rendersTools() bool {
	return t.toolUse != "" || strings.Contains(t.src, "tools") || strings.Contains(t.src, "tool_calls")
}

// toolSyntax is how a model with this template writes a call: the family's the source names, else Hermes's.
func (t *Jinja) toolSyntax() parley.ToolSyntax {
	src := t.src + t.toolUse
	switch {
	case strings.Contains(src, "[TOOL_CALLS]"):
		return mistralSyntax
	case strings.Contains(src, "<|python_tag|>"):
		return llama3Syntax
	case strings.Contains(src, "<tool_call>"):
		return hermesSyntax
	case t.ThinkFormat() == ThinkHarmony:
		return harmonyToolSyntax
	}
	return ToolSyntaxOf(t.fallback)
}

// RenderJinja renders with the Jinja template only (no fallback).
func (t *Jinja) RenderJinja(msgs []parley.Message, opt RenderOptions) (string, error) {
	imageText := t.imageText()
	vars, err := buildVars(msgs, opt, t.bos, t.eos, t.now().Unix(), t.thinkingKey, imageText != "")
	if err != nil {
		return "", err
	}
	src := t.src
	if len(opt.Tools) > 0 && t.toolUse != "" {
		src = t.toolUse
	}
	out, err := t.renderer.RenderJinja(src, vars)
	if err != nil {
		return "", err
	}
	if t.bos != "" {
		out = strings.TrimPrefix(out, t.bos) // the tokenizer adds BOS
	}
	if n := parley.ImageCount(msgs); n > 0 && imageText != "" {
		return markTemplateImages(out, imageText, n)
	}
	return out, nil
}

// LoadJinja returns the template for src once it has passed the probes: it renders probe conversations (a plain
// chat, a multi-turn history, tools with a call and its result, thinking in the history and switched off, and a
// 200-message conversation) through cfg.Renderer. A template is refused when it does not compile, when it fails the
// plain chat, or when any probe exceeds the renderer's limits (time, memory, output size). Other probes may fail:
// templates raise on what their model does not support (tools, a system role).
func LoadJinja(src string, cfg JinjaConfig) (*Jinja, error) {
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("the chat template is empty")
	}
	t := NewJinja(src, cfg)
	for _, p := range probes() {
		_, err := t.RenderJinja(p.msgs, p.opt)
		if err == nil {
			continue
		}
		if errors.Is(err, ErrTemplateLimit) && len(p.opt.Tools) > 0 && t.toolUse != "" {
			t.log.Error("the model's tool_use chat template is refused; the main template renders tools", zap.Error(err))
			t.toolUse = ""
			continue
		}
		if p.required || errors.Is(err, ErrTemplateLimit) {
			return nil, fmt.Errorf("chat template refused (probe %q): %w", p.name, err)
		}
	}
	return t, nil
}

type probe struct {
	name     string
	msgs     []parley.Message
	opt      RenderOptions
	required bool
}

func probes() []probe {
	off := false
	weather := parley.Tool{Name: "get_weather", Description: "Get the weather in a city",
		Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}
	long := []parley.Message{{Role: parley.RoleSystem, Content: "You are a helpful assistant."}}
	for i := range 100 {
		long = append(long, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("Question %d: what is %d + %d?", i, i, i)},
			parley.Message{Role: parley.RoleAssistant, Content: fmt.Sprintf("It is %d.", 2*i), Reasoning: "Adding."})
	}
	long[len(long)-1] = parley.Message{Role: parley.RoleUser, Content: "Thanks."}
	return []probe{
		{name: "plain chat", required: true, opt: Gen, msgs: []parley.Message{{Role: parley.RoleUser, Content: "Hello"}}},
		{name: "multi-turn", opt: Gen, msgs: []parley.Message{
			{Role: parley.RoleSystem, Content: "You are a helpful assistant."},
			{Role: parley.RoleUser, Content: "Hello"}, {Role: parley.RoleAssistant, Content: "Hi there"},
			{Role: parley.RoleUser, Content: "Who are you?"}}},
		{name: "tools", opt: RenderOptions{AddGenerationPrompt: true, Tools: []parley.Tool{weather}}, msgs: []parley.Message{
			{Role: parley.RoleUser, Content: "Weather in Paris?"},
			{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
			{Role: parley.RoleTool, ToolCallID: "call_1", Name: "get_weather", Content: `{"temp_c":21}`}}},
		{name: "thinking off", opt: RenderOptions{AddGenerationPrompt: true, Thinking: &off}, msgs: []parley.Message{
			{Role: parley.RoleUser, Content: "Hello"},
			{Role: parley.RoleAssistant, Content: "Hi", Reasoning: "The user greets me."},
			{Role: parley.RoleUser, Content: "Bye"}}},
		{name: "200 messages", opt: Gen, msgs: long},
	}
}
