package jsonmode_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/jsonmode"
)

// Each server message of the README's schema decodes into Message.
func TestDecode(t *testing.T) {
	tests := []struct {
		name  string
		wire  string
		check func(m jsonmode.Message) bool
	}{
		{"session", `{"type":"session","id":"AAAAAAAAAAAAAAAAAAAAAA","resumed":true,"messages":[{"role":"user","content":"Hi"}]}`,
			func(m jsonmode.Message) bool {
				return m.SessionID() == "AAAAAAAAAAAAAAAAAAAAAA" && m.Resumed && len(m.Messages) == 1 &&
					reflect.DeepEqual(m.Messages[0], parley.Message{Role: parley.RoleUser, Content: "Hi"})
			}},
		{"token", `{"type":"token","id":42,"text":" a","logprob":-0.5,"special":false}`,
			func(m jsonmode.Message) bool {
				return string(m.ID) == "42" && m.SessionID() == "" && m.Text == " a" && m.Logprob == -0.5
			}},
		{"done", `{"type":"done","finish_reason":"length","content":"x","usage":{"prompt_tokens":5,"cached_prompt_tokens":2,"completion_tokens":3},"timings":{"queued_ms":1,"ttft_ms":2.5,"tokens_per_second":100,"total_ms":30}}`,
			func(m jsonmode.Message) bool {
				return m.FinishReason == "length" && m.Content == "x" &&
					m.Usage == jsonmode.Usage{PromptTokens: 5, CachedPromptTokens: 2, CompletionTokens: 3} &&
					m.Timings == jsonmode.Timings{QueuedMS: 1, TTFTMS: 2.5, TokensPerSecond: 100, TotalMS: 30}
			}},
		{"error", `{"type":"error","code":"invalid","message":"temperature: must be >= 0","field":"params.temperature"}`,
			func(m jsonmode.Message) bool {
				return m.Code == "invalid" && m.Message == "temperature: must be >= 0" && m.Field == "params.temperature"
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m jsonmode.Message
			if err := json.Unmarshal([]byte(tt.wire), &m); err != nil {
				t.Fatal(err)
			}
			if m.Type != tt.name || !tt.check(m) {
				t.Fatalf("%s decoded as %+v", tt.wire, m)
			}
		})
	}
}
