package web_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type jsonLine struct {
	TokenID       *int     `json:"token_id"`
	TokenText     *string  `json:"token_text"`
	TokenLogProb  *float64 `json:"token_log_prob"`
	TokenSpecial  *bool    `json:"token_special"`
	GeneratedText *string  `json:"generated_text"`
	FinishReason  string   `json:"finish_reason"`
	Usage         *struct {
		PromptTokens       int `json:"prompt_tokens"`
		CachedPromptTokens int `json:"cached_prompt_tokens"`
		CompletionTokens   int `json:"completion_tokens"`
	} `json:"usage"`
	Timings *struct {
		QueuedMS        float64 `json:"queued_ms"`
		TTFTMS          float64 `json:"ttft_ms"`
		TokensPerSecond float64 `json:"tokens_per_second"`
		TotalMS         float64 `json:"total_ms"`
	} `json:"timings"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// jsonLines posts a TGI-style body to /generate?format=... and returns the
// lines, checking that each is one JSON object ending in "\n".
func jsonLines(tb testing.TB, s *stack, format string, params map[string]any) []jsonLine {
	tb.Helper()
	res := post(tb, s.base+"/generate?format="+format, map[string]any{"inputs": "Once upon a time", "parameters": params})
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/jsonlines" {
		tb.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(res.Body)
	var out []jsonLine
	for {
		line, err := br.ReadString('\n')
		if line == "" && err != nil {
			break
		}
		if !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 {
			tb.Fatalf("line %d %q is not one newline-terminated line", len(out), line)
		}
		var l jsonLine
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			tb.Fatalf("line %d %q: %v", len(out), line, err)
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		tb.Fatal("no lines")
	}
	for i, l := range out[:len(out)-1] {
		if l.FinishReason != "" || l.Usage != nil {
			tb.Fatalf("line %d of %d carries final fields: %+v", i, len(out), l)
		}
	}
	last := out[len(out)-1]
	if last.FinishReason == "" || last.Usage == nil || last.Timings == nil {
		tb.Fatalf("last line lacks finish_reason, usage or timings: %+v", last)
	}
	return out
}

func TestJSONLines(t *testing.T) {
	s := mustOpenAPI(t, nil)
	want := generate(t, s, "Once upon a time", map[string]any{"max_new_tokens": 10}).GeneratedText

	// One object per token; the reply ends on its cap, so the 10th line is
	// the last token's and carries finish_reason.
	lines := jsonLines(t, s, "jsonlines", map[string]any{"max_new_tokens": 10})
	if len(lines) != 10 {
		t.Fatalf("%d lines, want 10", len(lines))
	}
	var text strings.Builder
	for i, l := range lines {
		if l.TokenID == nil || l.TokenText == nil || l.TokenLogProb == nil || l.TokenSpecial == nil || l.GeneratedText != nil {
			t.Fatalf("line %d: %+v", i, l)
		}
		if *l.TokenLogProb > 0 {
			t.Fatalf("line %d: log-probability %v > 0", i, *l.TokenLogProb)
		}
		text.WriteString(*l.TokenText)
	}
	last := lines[9]
	if text.String() != want || last.FinishReason != "length" || last.Usage.CompletionTokens != 10 {
		t.Fatalf("lines say %q (%s), /generate said %q", text.String(), last.FinishReason, want)
	}

	// Cumulative: each line carries the whole text so far.
	cum := jsonLines(t, s, "jsonlines-cumulative", map[string]any{"max_new_tokens": 10})
	if len(cum) != 10 {
		t.Fatalf("%d cumulative lines, want 10", len(cum))
	}
	prev := ""
	for i, l := range cum {
		if l.TokenID == nil || l.GeneratedText == nil || l.TokenText != nil {
			t.Fatalf("cumulative line %d: %+v", i, l)
		}
		if !strings.HasPrefix(*l.GeneratedText, prev) {
			t.Fatalf("line %d %q does not extend %q", i, *l.GeneratedText, prev)
		}
		prev = *l.GeneratedText
	}
	if prev != want {
		t.Fatalf("cumulative text %q, want %q", prev, want)
	}

	// A reply that ends on a stop string ends with an end line: no token id,
	// the finish reason, and (cumulative) the whole text.
	stop := strings.Fields(want)[2]
	for _, format := range []string{"jsonlines", "jsonlines-cumulative"} {
		lines := jsonLines(t, s, format, map[string]any{"max_new_tokens": 10, "stop": stop})
		end := lines[len(lines)-1]
		if end.TokenID != nil || end.FinishReason != "stop" {
			t.Fatalf("%s: end line %+v", format, end)
		}
		if format == "jsonlines-cumulative" && *end.GeneratedText != want[:strings.Index(want, stop)] {
			t.Fatalf("cumulative text at the stop: %q", *end.GeneratedText)
		}
	}

	// A JSON schema constrains the lines' text too.
	schema := map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer", "minimum": 0, "maximum": 9}}, "required": []string{"n"}}
	cj := jsonLines(t, s, "jsonlines-cumulative", map[string]any{"max_new_tokens": 60, "json_schema": schema})
	end := cj[len(cj)-1]
	var obj struct {
		N *int `json:"n"`
	}
	if err := json.Unmarshal([]byte(*end.GeneratedText), &obj); err != nil || obj.N == nil || *obj.N < 0 || *obj.N > 9 || end.FinishReason != "eos" {
		t.Fatalf("json_schema reply %q (%s): %v", *end.GeneratedText, end.FinishReason, err)
	}

	// Bad parameters are refused before streaming, naming the field.
	wantFieldError(t, post(t, s.base+"/generate?format=jsonlines", map[string]any{"inputs": "x", "parameters": map[string]any{"top_k": "ten"}}), 400, "parameters.top_k")
}
