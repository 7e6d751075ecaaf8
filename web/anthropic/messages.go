// Package anthropic serves Anthropic's Messages API, as the official SDKs and Claude-style clients
// use it: POST /v1/messages (one message, or server-sent events when
// "stream": true) and POST /v1/messages/count_tokens. Stateless: every
// request carries the whole conversation, and the conversation's key
// (anthropicKey) sends each turn to the slot that holds the previous one, so
// only the new turn is evaluated.
//
// Supported: system (a string or text blocks), messages of user, assistant
// (and system, anywhere in the list) roles whose content is a string or text
// blocks, max_tokens
// (required), temperature, top_p, top_k, stop_sequences, metadata, and
// Parley's own sampling fields (min_p, seed, grammar, json_schema, ...);
// structured output (output_config.format, or output_format, with a JSON
// schema: the reply's text is JSON that validates); tools, tool_choice, tool_use and tool_result blocks (tools.go).
// cache_control marks are accepted and ignored (Parley caches every prefix
// without being asked). Images and documents are refused with a 400 naming
// the block. thinking switches a reasoning model's thought
// (enabled, with budget_tokens its cap; disabled; adaptive: the model's
// default); its thought comes back as a thinking block before the text, and
// the thinking blocks clients send back are the assistant turn's reasoning.
//
// usage follows Anthropic's accounting: input_tokens are the prompt tokens
// evaluated for this request, cache_read_input_tokens those reused from the
// KV cache, so their sum is the prompt's size, which count_tokens reports.
package anthropic

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// anthropicKey is a Messages conversation's KV-cache key: apicore.ConversationKey
// of the messages after the volatile system blocks were dropped, so every
// turn of one conversation has the same key.
func anthropicKey(msgs []parley.Message) string {
	return "anthropic:" + strings.TrimPrefix(apicore.ConversationKey(msgs), "openai:")
}

func anthropicMessageID() string {
	return fmt.Sprintf("msg_%016x%08x", rand.Uint64(), rand.Uint32())
}

// anthropicUsage is a reply's usage in Anthropic's accounting (see the
// package comment above).
type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

func newAnthropicUsage(u parley.Usage) anthropicUsage {
	return anthropicUsage{
		InputTokens:          u.PromptTokens - u.CachedPromptTokens,
		OutputTokens:         u.CompletionTokens,
		CacheReadInputTokens: u.CachedPromptTokens,
	}
}

// anthropicContent is a content block of a reply: text (Text set, maybe
// to ""), thinking (Thinking and Signature set; Parley signs nothing, so
// the signature is "") or tool_use (ID, Name, Input).
type anthropicContent struct {
	Type      string          `json:"type"` // "text", "thinking" or "tool_use"
	Text      *string         `json:"text,omitempty"`
	Thinking  *string         `json:"thinking,omitempty"`
	Signature *string         `json:"signature,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
}

func anthropicTextBlock(text string) anthropicContent {
	return anthropicContent{Type: "text", Text: &text}
}

func anthropicThinkingBlock(thought string) anthropicContent {
	sig := ""
	return anthropicContent{Type: "thinking", Thinking: &thought, Signature: &sig}
}

// anthropicMessageOut is the Message object: the whole reply, or (content
// empty, stop_reason null) the stream's message_start.
type anthropicMessageOut struct {
	ID           string             `json:"id"`
	Type         string             `json:"type"` // "message"
	Role         string             `json:"role"` // "assistant"
	Model        string             `json:"model"`
	Content      []anthropicContent `json:"content"`
	StopReason   *string            `json:"stop_reason"`
	StopSequence *string            `json:"stop_sequence"`
	StopDetails  json.RawMessage    `json:"stop_details"` // always null: Parley has no refusals
	Usage        anthropicUsage     `json:"usage"`
}

// anthropicStop is the stop_reason and stop_sequence of a finished reply.
// stop is the stop string that ended it (a template's end-of-turn string
// ends the turn; one of the request's stop_sequences is reported as such).
func anthropicStop(ev parley.Event, stop string, stops []string, maxTokens int) (reason string, seq *string) {
	switch ev.Finish {
	case parley.FinishToolCalls:
		return "tool_use", nil
	case parley.FinishStop:
		for _, s := range stops {
			if s == stop {
				return "stop_sequence", &stop
			}
		}
		return "end_turn", nil
	case parley.FinishLength:
		if ev.Usage.CompletionTokens < maxTokens {
			return "model_context_window_exceeded", nil
		}
		return "max_tokens", nil
	}
	return "end_turn", nil
}

// Messages is POST /v1/messages.
func (s *API) Messages(c echo.Context) error {
	ac, err := s.parseAnthropicBody(c, false)
	if err != nil {
		return err
	}
	route := "anthropic"
	if ac.stream {
		route = "anthropic-stream"
	}
	call, err := s.core.StartChat(c, ac.facts, route, ac.key, ac.msgs, ac.params)
	if err != nil {
		return ac.patch.RenameSent(err)
	}
	id, model := anthropicMessageID(), s.core.ModelName(ac.facts.Model)
	if ac.stream {
		s.streamAnthropic(c, call, ac, id, model)
		return nil
	}
	_, ev := call.Collect()
	if rerr := apicore.ReplyError(ev); rerr != nil {
		return ac.patch.RenameSent(rerr)
	}
	reason, seq := anthropicStop(ev, call.Rep.StopSequence(), ac.stops, ac.params.MaxTokens)
	content := []anthropicContent{}
	if thought := call.Rep.Reasoning(); thought != "" {
		content = append(content, anthropicThinkingBlock(thought))
	}
	if text := call.Rep.Text(); text != "" {
		content = append(content, anthropicTextBlock(text))
	}
	for _, tc := range ev.ToolCalls {
		content = append(content, anthropicToolUseOut(tc))
	}
	return c.JSON(http.StatusOK, anthropicMessageOut{
		ID: id, Type: "message", Role: "assistant", Model: model, Content: content,
		StopReason: &reason, StopSequence: seq, StopDetails: json.RawMessage("null"),
		Usage: newAnthropicUsage(ev.Usage),
	})
}

// CountTokens is POST /v1/messages/count_tokens: the prompt's tokens,
// as the same request to /v1/messages would count them (its usage's
// input_tokens plus cache_read_input_tokens).
func (s *API) CountTokens(c echo.Context) error {
	ac, err := s.parseAnthropicBody(c, true)
	if err != nil {
		return err
	}
	if err := s.core.Available(); err != nil {
		return err
	}
	n, ok, err := s.core.CountTokens(c.Request().Context(), ac.facts, ac.key, ac.msgs, ac.params)
	if !ok {
		return parley.Errorf(parley.ENotFound, "this server cannot count tokens")
	}
	if err != nil {
		return renameToolField(err)
	}
	return c.JSON(http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{n})
}

// IsClient reports whether r comes from one of Anthropic's SDKs,
// which send anthropic-version on every request.
func IsClient(r *http.Request) bool {
	return r.Header.Get("anthropic-version") != ""
}

// API serves Anthropic's endpoints over the shared core.
type API struct {
	core *apicore.Core
}

// New returns the endpoints over core.
func New(core *apicore.Core) *API { return &API{core: core} }
