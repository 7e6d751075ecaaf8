package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type legacyCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *oaiUsage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func TestOpenAILegacyCompletions(t *testing.T) {
	s := mustOpenAPI(t, nil)
	greedy := func(extra map[string]any) map[string]any {
		b := map[string]any{"model": "x", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	var c legacyCompletion
	decodeBody(t, post(t, s.base+"/v1/completions", greedy(map[string]any{"logprobs": 2})), http.StatusOK, &c)
	if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || len(c.Choices) != 1 || c.Usage == nil {
		t.Fatalf("completion %+v", c)
	}
	ch := c.Choices[0]
	if ch.Text == "" || ch.FinishReason == nil || *ch.FinishReason != "length" || c.Usage.CompletionTokens != 10 {
		t.Fatalf("choice %+v usage %+v", ch, c.Usage)
	}
	lp := ch.Logprobs
	if lp == nil || len(lp.Tokens) != 10 || len(lp.TokenLogprobs) != 10 || len(lp.TopLogprobs) != 10 || lp.TextOffset[0] != 0 {
		t.Fatalf("logprobs %+v", lp)
	}
	if strings.Join(lp.Tokens, "") != ch.Text {
		t.Fatalf("logprob tokens %q, text %q", lp.Tokens, ch.Text)
	}

	// Streamed: the same text (greedy), a finish reason, usage, [DONE].
	res := post(t, s.base+"/v1/completions", greedy(map[string]any{"prompt": []string{"Once upon a time"}, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	events := readSSE(t, res.Body, "data: ")
	if len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var text strings.Builder
	var finish string
	var usage *oaiUsage
	for _, e := range events[:len(events)-1] {
		var k legacyCompletion
		if err := json.Unmarshal([]byte(e), &k); err != nil || k.Object != "text_completion" || k.Error != nil {
			t.Fatalf("chunk %q: %v", e, err)
		}
		for _, c := range k.Choices {
			text.WriteString(c.Text)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
		if k.Usage != nil {
			usage = k.Usage
		}
	}
	if text.String() != ch.Text || finish != "length" || usage == nil || usage.CompletionTokens != 10 {
		t.Fatalf("stream: text %q (want %q) finish %q usage %+v", text.String(), ch.Text, finish, usage)
	}

	// A stop string ends the reply with finish_reason stop.
	var st legacyCompletion
	decodeBody(t, post(t, s.base+"/v1/completions", greedy(map[string]any{"stop": []string{ch.Text[len(ch.Text)/2:]}})), http.StatusOK, &st)
	if got := st.Choices[0]; got.FinishReason == nil || *got.FinishReason != "stop" || got.Text != ch.Text[:len(ch.Text)/2] {
		t.Fatalf("stop: %+v", got)
	}

	for _, bad := range []map[string]any{
		{"prompt": nil},
		{"prompt": []int{1, 2}},
		{"prompt": []string{"a", "b"}},
		{"echo": true},
		{"n": 2},
		{"logprobs": 9},
	} {
		res := post(t, s.base+"/v1/completions", greedy(bad))
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%v: status %d, want 400", bad, res.StatusCode)
		}
	}
}
