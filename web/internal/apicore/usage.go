package apicore

import (
	"math"
	"time"

	"github.com/parley-chat/parley"
)

// Usage is a reply's token counts as Parley's own wires show them.
type Usage struct {
	PromptTokens       int `json:"prompt_tokens"`
	CachedPromptTokens int `json:"cached_prompt_tokens"`
	CompletionTokens   int `json:"completion_tokens"`
	ReasoningTokens    int `json:"reasoning_tokens,omitempty"` // of the completion tokens, the thought's
}

// Timings is a reply's timings as Parley's own wires show them.
type Timings struct {
	QueuedMS        float64 `json:"queued_ms"`
	TTFTMS          float64 `json:"ttft_ms"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	TotalMS         float64 `json:"total_ms"`
	// DraftN and DraftNAccepted are llama-server's names for the reply's
	// draft tokens (speculative decoding) and those that held; absent
	// without drafts.
	DraftN         int `json:"draft_n,omitempty"`
	DraftNAccepted int `json:"draft_n_accepted,omitempty"`
}

// NewUsage is u as Usage.
func NewUsage(u parley.Usage) Usage {
	return Usage{PromptTokens: u.PromptTokens, CachedPromptTokens: u.CachedPromptTokens, CompletionTokens: u.CompletionTokens,
		ReasoningTokens: u.ReasoningTokens}
}

// NewTimings is t as Timings; completion is the reply's token count.
func NewTimings(t parley.Timings, completion int) Timings {
	ms := func(d time.Duration) float64 { return Round2(float64(d) / float64(time.Millisecond)) }
	return Timings{
		QueuedMS:        ms(t.Queued),
		TTFTMS:          ms(t.TimeToFirstToken),
		TokensPerSecond: Round2(t.TokensPerSecond(completion)),
		TotalMS:         ms(t.Total),
		DraftN:          t.Drafted,
		DraftNAccepted:  t.DraftAccepted,
	}
}

// Round2 rounds f to two decimals.
func Round2(f float64) float64 { return math.Round(f*100) / 100 }

// Finite makes a float safe for JSON (which has no NaN or Inf).
func Finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 1) {
		return 0
	}
	if math.IsInf(f, -1) {
		return -math.MaxFloat32
	}
	return f
}
