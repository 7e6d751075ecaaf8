package openai

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// openAIMessage is one message of a request. Content is a string or an
// array of parts; only text parts are accepted.
type openAIMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"`
	ToolCalls  []openAIToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	Name       string           `json:"name"`
	// ReasoningContent is an assistant message's thought, as clients send back what they received (the template
	// decides whether the prompt keeps it).
	ReasoningContent string `json:"reasoning_content"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

type chatRequest struct {
	openAIRequest
	Messages       []openAIMessage `json:"messages"`
	Logprobs       bool            `json:"logprobs"`
	TopLogprobs    *int            `json:"top_logprobs"`
	ResponseFormat *responseFormat `json:"response_format"`
	Tools          json.RawMessage `json:"tools"`
	ToolChoice     json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls is accepted; a reply makes at most one call.
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
}

type openAIUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

func newOpenAIUsage(u parley.Usage) *openAIUsage {
	o := &openAIUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
	o.PromptTokensDetails.CachedTokens = u.CachedPromptTokens
	o.CompletionTokensDetails.ReasoningTokens = u.ReasoningTokens
	return o
}

type topLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type tokenLogprob struct {
	topLogprob
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
	Refusal []tokenLogprob `json:"refusal"`
}

type chatMessageOut struct {
	Role      string           `json:"role"`
	Content   *string          `json:"content"` // null when the reply is only tool calls
	Refusal   *string          `json:"refusal"`
	ToolCalls []openAIToolCall `json:"tool_calls,omitempty"`
	// ReasoningContent is a reasoning model's thought, as llama.cpp's server and DeepSeek's API name it.
	ReasoningContent string `json:"reasoning_content,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatCompletion struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"` // "chat.completion"
	Created           int64            `json:"created"`
	Model             string           `json:"model"`
	SystemFingerprint string           `json:"system_fingerprint"`
	Choices           []chatChoice     `json:"choices"`
	Usage             *openAIUsage     `json:"usage"`
	Timings           *apicore.Timings `json:"timings,omitempty"` // Parley's (and llama.cpp's) extension
}

type chunkDelta struct {
	Role             string           `json:"role,omitempty"`
	Content          *string          `json:"content,omitempty"`
	ReasoningContent *string          `json:"reasoning_content,omitempty"`
	ToolCalls        []openAIToolCall `json:"tool_calls,omitempty"`
}

type chunkChoice struct {
	Index        int           `json:"index"`
	Delta        chunkDelta    `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatChunk struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"` // "chat.completion.chunk"
	Created           int64            `json:"created"`
	Model             string           `json:"model"`
	SystemFingerprint string           `json:"system_fingerprint"`
	Choices           []chunkChoice    `json:"choices"`
	Usage             json.RawMessage  `json:"usage,omitempty"` // null on every chunk but the last when include_usage is set
	Timings           *apicore.Timings `json:"timings,omitempty"`
}

// openAIFinish maps a finish reason to OpenAI's; "" for the ones reported as errors.
func openAIFinish(f parley.FinishReason) string {
	switch f {
	case parley.FinishStop, parley.FinishEOS:
		return "stop"
	case parley.FinishLength:
		return "length"
	case parley.FinishToolCalls:
		return "tool_calls"
	}
	return ""
}

// systemFingerprint identifies the configuration that produced a reply.
const systemFingerprint = "parley"

func completionID() string {
	return fmt.Sprintf("chatcmpl-%016x%08x", rand.Uint64(), rand.Uint32())
}

// tokenLogprobOf is t's logprob entry; with top > 0 its top_logprobs list
// holds the sampled token (the engine reports no other candidates).
func tokenLogprobOf(t parley.Token, top int) tokenLogprob {
	b := make([]int, len(t.Text))
	for i := range len(t.Text) {
		b[i] = int(t.Text[i])
	}
	lp := tokenLogprob{topLogprob: topLogprob{Token: t.Text, Logprob: apicore.Finite(t.Logprob), Bytes: b}, TopLogprobs: []topLogprob{}}
	if top > 0 {
		lp.TopLogprobs = append(lp.TopLogprobs, lp.topLogprob)
	}
	return lp
}
