package web

import (
	"bytes"
	"math"
	"sync"
	"time"

	"github.com/parley-chat/parley"
)

// Messages of the structured (JSON) WebSocket mode: server -> client, then
// client -> server (clientMessage) at the end.

type sessionMessage struct {
	Type     string           `json:"type"` // "session"
	ID       string           `json:"id"`
	Resumed  bool             `json:"resumed"`
	Model    string           `json:"model,omitempty"` // the session's model, when the server serves several
	Messages []historyMessage `json:"messages"`
	Reply    *liveReplyJSON   `json:"reply,omitempty"` // a reply in flight, on resume (ws_resume.go)
}

type tokenMessage struct {
	Type    string  `json:"type"` // "token"
	ID      int     `json:"id"`
	Text    string  `json:"text"`
	Logprob float64 `json:"logprob"`
	Special bool    `json:"special"`
	Seq     int     `json:"seq"` // the token's position in its reply, from 1 (see resume_from)
}

type usageJSON struct {
	PromptTokens       int `json:"prompt_tokens"`
	CachedPromptTokens int `json:"cached_prompt_tokens"`
	CompletionTokens   int `json:"completion_tokens"`
	ReasoningTokens    int `json:"reasoning_tokens,omitempty"` // of the completion tokens, the thought's
}

type timingsJSON struct {
	QueuedMS        float64 `json:"queued_ms"`
	TTFTMS          float64 `json:"ttft_ms"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	TotalMS         float64 `json:"total_ms"`
}

type doneMessage struct {
	Type         string      `json:"type"` // "done"
	FinishReason string      `json:"finish_reason"`
	Content      string      `json:"content"`
	Thinking     string      `json:"thinking,omitempty"` // a reasoning model's whole thought, kept apart from content
	Usage        usageJSON   `json:"usage"`
	Timings      timingsJSON `json:"timings"`
	// ToolCalls are the reply's complete tool calls (finish_reason "tool_calls").
	ToolCalls []parley.ToolCall `json:"tool_calls,omitempty"`
}

type errorMessage struct {
	Type    string `json:"type"` // "error"
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// RetryAfter is when to try again, in seconds (rate limits, a full
	// store), as HTTP's Retry-After says it.
	RetryAfter int `json:"retry_after,omitempty"`
}

func newUsage(u parley.Usage) usageJSON {
	return usageJSON{PromptTokens: u.PromptTokens, CachedPromptTokens: u.CachedPromptTokens, CompletionTokens: u.CompletionTokens,
		ReasoningTokens: u.ReasoningTokens}
}

func newTimings(t parley.Timings, completion int) timingsJSON {
	ms := func(d time.Duration) float64 { return round2(float64(d) / float64(time.Millisecond)) }
	return timingsJSON{
		QueuedMS:        ms(t.Queued),
		TTFTMS:          ms(t.TimeToFirstToken),
		TokensPerSecond: round2(t.TokensPerSecond(completion)),
		TotalMS:         ms(t.Total),
	}
}

func newDoneMessage(ev parley.Event, content string) doneMessage {
	return doneMessage{
		Type:         "done",
		FinishReason: string(ev.Finish),
		Content:      content,
		Usage:        newUsage(ev.Usage),
		Timings:      newTimings(ev.Timings, ev.Usage.CompletionTokens),
		ToolCalls:    ev.ToolCalls,
	}
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// finite makes a float safe for JSON (which has no NaN or Inf).
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 1) {
		return 0
	}
	if math.IsInf(f, -1) {
		return -math.MaxFloat32
	}
	return f
}

// rateLimiter allows n events per window: a token bucket that holds at
// most n tokens (the burst) and refills n per window. Its state is two
// numbers whatever n is, so a high configured rate costs no memory per
// connection (a log of event times would hold up to n of them).
type rateLimiter struct {
	mu     sync.Mutex
	n      float64
	window time.Duration
	tokens float64   // guarded by mu; in [0, n]
	last   time.Time // guarded by mu; when tokens was last brought up to date
}

func newRateLimiter(n int, window time.Duration) *rateLimiter {
	return &rateLimiter{n: float64(n), window: window, tokens: float64(n)}
}

func (r *rateLimiter) allow(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.After(r.last) {
		r.tokens = min(r.n, r.tokens+r.n*float64(now.Sub(r.last))/float64(r.window))
	}
	r.last = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}

// clientMessage is what a client sends in JSON mode.
type clientMessage struct {
	Type       string    `json:"type"`
	Content    *string   `json:"content"`
	Params     *wsParams `json:"params"`
	ToolCallID string    `json:"tool_call_id"` // tool_result: the call it answers
	// Model (prompt), with several models, picks the session's model
	// before its first turn; a session with a history keeps its own.
	Model string `json:"model"`
}

// parseClientMessage decodes and checks one JSON-mode client message: a
// known type, and the content that type needs. Errors are EInvalid *Errors
// naming the field, safe to show the client. (Sampling parameters are
// checked against the server's defaults and cap by resolveParams.)
func parseClientMessage(data []byte) (clientMessage, error) {
	var m clientMessage
	if err := decodeJSON(bytes.NewReader(data), &m); err != nil {
		return m, err
	}
	switch m.Type {
	case "prompt", "system":
		if m.Content == nil {
			return m, parley.FieldErrorf("content", "is required")
		}
		if m.Type == "prompt" && *m.Content == "" {
			return m, parley.FieldErrorf("content", "must not be empty")
		}
	case "tool_result":
		if m.ToolCallID == "" {
			return m, parley.FieldErrorf("tool_call_id", "is required")
		}
		if m.Content == nil {
			return m, parley.FieldErrorf("content", "is required")
		}
	case "cancel", "reset", "regenerate", "continue":
	case "":
		return m, parley.FieldErrorf("type", "is required")
	default:
		return m, parley.FieldErrorf("type", "unknown message type %q (want prompt, tool_result, regenerate, continue, cancel, reset or system)", m.Type)
	}
	return m, nil
}
