// Package parley holds the domain types every layer shares: sampling
// parameters, the token events a reply streams as, finish reasons, usage and
// timings, and the error codes that the wire layer maps to statuses in one
// place. It has no dependencies beyond the standard library, so the pure
// packages (chat, session) and the engine (llm) can all speak it.
//
// Data flows one way: web (wire) -> session (history) -> chat (prompt) ->
// llm (tokens) -> back up as a stream of Events. The contract between the
// layers that hold requests and the one that answers them is declared here
// once: a Responder starts a Reply to a ReplyRequest (responder.go); chat
// implements it over one engine, the router over several, and session and
// web only call it.
package parley

import (
	"encoding/json"
	"time"
)

// Role is who said a message.
type Role string

// Roles a conversation can hold.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	// RoleTool carries a tool's result back to the model; ToolCallID names the call it answers.
	RoleTool Role = "tool"
)

// Message is one turn of a conversation.
//
// Reasoning is a thinking model's thought, kept apart from Content (the answer); what of it goes back into the next
// prompt is the chat template's choice. ToolCalls are the calls an assistant turn made; a RoleTool message answers one
// of them by ToolCallID (Name is the tool's name where the wire gives it). All of them are empty for plain chat, and
// omitted from stored JSON so that sessions stored before they existed read back unchanged.
type Message struct {
	Role    Role   `json:"role"`
	Content string `json:"content"`
	// Images are the message's images (a user's, or a tool result's), shown to the model before Content.
	Images     []ImagePart `json:"images,omitempty"`
	Reasoning  string      `json:"reasoning,omitempty"`
	ToolCalls  []ToolCall  `json:"tool_calls,omitempty"`
	ToolCallID string      `json:"tool_call_id,omitempty"`
	Name       string      `json:"name,omitempty"`
	// Interrupted marks an assistant reply that was cut short (cancelled,
	// or its client left and did not come back in time): Content is what
	// was generated until then.
	Interrupted bool `json:"interrupted,omitempty"`
	// ToolError is, on a tool message that answers a call the server made
	// (ToolCall.Server), why the call failed or the error the tool
	// reported; "" when it succeeded. Content is what the model read.
	ToolError string `json:"tool_error,omitempty"`
}

// Tool is a function the model may call: its name, what it does, and the JSON schema of its arguments.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ToolCall is one function call an assistant turn made. Arguments is the call's arguments as JSON text, exactly as
// generated (it always parses and validates against the tool's schema when Parley constrained it).
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// Server marks a call to a tool the server runs itself (an MCP
	// server's), so a stored conversation shows it as such; nil for a
	// call the client makes.
	Server *ServerCall `json:"server,omitempty"`
}

// ServerCall is what a stored call to a server's tool keeps of that tool.
type ServerCall struct {
	Label    string `json:"label"`              // the server's label
	Tool     string `json:"tool"`               // the tool's name on its server (Name is the model's)
	Approval bool   `json:"approval,omitempty"` // the call waits for (or waited for) the user's approval
}

// FinishReason says why a reply ended.
type FinishReason string

// Finish reasons, as they appear on every wire format.
const (
	FinishStop      FinishReason = "stop"      // a stop string matched
	FinishLength    FinishReason = "length"    // the reply cap or the context window was reached
	FinishEOS       FinishReason = "eos"       // the model produced an end-of-generation token
	FinishCancelled FinishReason = "cancelled" // the client cancelled or went away
	FinishError     FinishReason = "error"     // the engine failed mid-reply
)

// Token is one generated token as the engine saw it.
type Token struct {
	ID      int     `json:"id"`
	Text    string  `json:"text"`    // the piece this token contributed; may be empty when UTF-8 or a stop prefix is held back
	Logprob float64 `json:"logprob"` // natural log-probability of this token under the sampler's temperature
	Special bool    `json:"special"` // an end-of-generation or control token
	// Reasoning is the thought text that became safe to show with this token (a reasoning model's, split from the
	// answer by the chat layer); Text is then the answer's part.
	Reasoning string `json:"reasoning,omitempty"`
}

// Usage counts tokens for one reply.
type Usage struct {
	PromptTokens       int `json:"prompt_tokens"`        // tokens in the rendered prompt
	CachedPromptTokens int `json:"cached_prompt_tokens"` // of those, reused from the KV cache (not evaluated again)
	CompletionTokens   int `json:"completion_tokens"`    // tokens generated
	ReasoningTokens    int `json:"reasoning_tokens"`     // of those, the thought's (markers included)
}

// Timings of one reply.
type Timings struct {
	Queued           time.Duration `json:"-"` // waiting for a slot
	TimeToFirstToken time.Duration `json:"-"` // from submission to the first generated token
	Total            time.Duration `json:"-"` // from submission to the end
	// Drafted is how many draft tokens speculative decoding verified for
	// the reply, DraftAccepted how many of them held (each a token
	// generated without a decode step of its own). Zero without drafts.
	Drafted, DraftAccepted int `json:"-"`
}

// TokensPerSecond is the decode rate after the first token.
func (t Timings) TokensPerSecond(completion int) float64 {
	gen := t.Total - t.TimeToFirstToken
	if completion <= 1 || gen <= 0 {
		return 0
	}
	return float64(completion-1) / gen.Seconds()
}

// Event is one step of a streamed reply: either a token, or the final event
// (Done set) that carries the finish reason, usage and timings. Exactly one
// Done event ends every stream; Err is set on it when FinishReason is FinishError.
type Event struct {
	Token   Token
	Done    bool
	Finish  FinishReason
	Usage   Usage
	Timings Timings
	Err     error
	// ToolCall, on a token event, is the part of a tool call the token
	// added (nil when it added none: text, or a held-back piece).
	ToolCall *ToolCallDelta
	// ToolCalls, on the final event, are the reply's complete tool calls;
	// Finish is then FinishToolCalls.
	ToolCalls []ToolCall
	// Aside, on a token event, is a note a layer above the engine sends in
	// order with the tokens (the server-side tool loop's calls and results):
	// layers that do not know it pass the event on unchanged, and its Token
	// is empty.
	Aside any
}
