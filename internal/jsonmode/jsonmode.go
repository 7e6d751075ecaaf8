// Package jsonmode is a client's view of Parley's structured WebSocket mode
// (subprotocol parley.v1+json, or ?format=json), for the tests and tools that
// speak it. It is written from the wire contract in the README, not from
// package web's own types, so a change of the wire shows in whatever uses it.
package jsonmode

import (
	"encoding/json"

	"github.com/parley-chat/parley"
)

// Message decodes any server message; Type says which, and the fields of
// the other types stay zero:
//
//   - "session": ID (a string), Resumed, Messages (the history), Reply
//     (on resume, a reply in flight: the history's last message holds its
//     text up to token Reply.Seq);
//   - "token": ID (the token id, a number), Text, Logprob, Special, Seq
//     (the token's position in its reply, from 1);
//   - "thinking": ID, Text (a piece of a reasoning model's thought), Logprob;
//   - "done": FinishReason, Content (the whole reply), Thinking (the whole thought), Usage, Timings;
//   - "error": Code, Message, Field;
//   - "tool_call": Index, ID (the call's id, a string: see SessionID), Name, Arguments (a piece of them);
//   - "done" of a reply that called tools: ToolCalls, FinishReason "tool_calls".
type Message struct {
	Type string `json:"type"`
	// ID is raw because its type depends on Type; see SessionID.
	ID       json.RawMessage  `json:"id"`
	Resumed  bool             `json:"resumed"`
	Messages []parley.Message `json:"messages"`
	Reply    *LiveReply       `json:"reply"`

	Text    string  `json:"text"`
	Logprob float64 `json:"logprob"`
	Special bool    `json:"special"`
	Seq     int     `json:"seq"`

	FinishReason string  `json:"finish_reason"`
	Content      string  `json:"content"`
	Thinking     string  `json:"thinking"`
	Usage        Usage   `json:"usage"`
	Timings      Timings `json:"timings"`

	Index     int               `json:"index"`
	Name      string            `json:"name"`
	Arguments string            `json:"arguments"`
	ToolCalls []parley.ToolCall `json:"tool_calls"`

	Model    string  `json:"model"`    // session: the session's model; loading: the model loading
	Progress float64 `json:"progress"` // loading: the fraction loaded

	Code       string `json:"code"`
	Message    string `json:"message"`
	Field      string `json:"field"`
	RetryAfter int    `json:"retry_after"`
}

// LiveReply is a session message's reply in flight: Status "generating",
// its text so far up to token Seq in the history's last message.
type LiveReply struct {
	Status string `json:"status"`
	Seq    int    `json:"seq"`
}

// Usage is a done message's token counts.
type Usage struct {
	PromptTokens       int `json:"prompt_tokens"`
	CachedPromptTokens int `json:"cached_prompt_tokens"`
	CompletionTokens   int `json:"completion_tokens"`
	ReasoningTokens    int `json:"reasoning_tokens"`
}

// Timings is a done message's timings, in milliseconds and tokens per second.
type Timings struct {
	QueuedMS        float64 `json:"queued_ms"`
	TTFTMS          float64 `json:"ttft_ms"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	TotalMS         float64 `json:"total_ms"`
}

// SessionID is a session message's id ("" when ID is not a string).
func (m Message) SessionID() string {
	var id string
	json.Unmarshal(m.ID, &id)
	return id
}
