package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

type tgiToken struct {
	ID      int     `json:"id"`
	Text    string  `json:"text"`
	Logprob float64 `json:"logprob"`
	Special bool    `json:"special"`
}

type tgiDetails struct {
	FinishReason    string       `json:"finish_reason"`
	GeneratedTokens int          `json:"generated_tokens"`
	Seed            *int64       `json:"seed"`
	Prefill         []tgiToken   `json:"prefill"`
	Tokens          []tgiToken   `json:"tokens"`
	TopTokens       [][]tgiToken `json:"top_tokens"`
}

type tgiResponse struct {
	GeneratedText string      `json:"generated_text"`
	Details       *tgiDetails `json:"details"`
}

type tgiEvent struct {
	Index         int         `json:"index"`
	Token         *tgiToken   `json:"token"`
	TopTokens     []tgiToken  `json:"top_tokens"`
	GeneratedText *string     `json:"generated_text"`
	Details       *tgiDetails `json:"details"`
	Usage         *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error     string `json:"error"`
	ErrorType string `json:"error_type"`
}

func generate(tb testing.TB, s *stack, inputs string, params map[string]any) tgiResponse {
	tb.Helper()
	var r tgiResponse
	decodeBody(tb, post(tb, s.base+"/generate", map[string]any{"inputs": inputs, "parameters": params}), http.StatusOK, &r)
	return r
}

// stream reads a TGI event stream from path; it checks the framing
// ("data:" lines, one blank line after each) and returns the events.
func stream(tb testing.TB, s *stack, path string, body map[string]any) []tgiEvent {
	tb.Helper()
	res := post(tb, s.base+path, body)
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("%s: status %d", path, res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		tb.Fatalf("%s: content type %q", path, ct)
	}
	var evs []tgiEvent
	for i, data := range readSSE(tb, res.Body, "data:") {
		var ev tgiEvent
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			tb.Fatalf("event %d %q: %v", i, data, err)
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		tb.Fatalf("%s: no events", path)
	}
	return evs
}

// checkStream checks the TGI event contract and returns the streamed text
// (the tokens' texts) and the last event.
func checkStream(tb testing.TB, evs []tgiEvent) (string, tgiEvent) {
	tb.Helper()
	var text strings.Builder
	for i, ev := range evs {
		if ev.Token == nil {
			tb.Fatalf("event %d has no token: %+v", i, ev)
		}
		if ev.Index != i+1 {
			tb.Fatalf("event %d has index %d", i, ev.Index)
		}
		if ev.Token.Logprob > 0 || ev.Token.Logprob < -100 {
			tb.Fatalf("event %d: implausible logprob %v", i, ev.Token.Logprob)
		}
		last := i == len(evs)-1
		if !last && (ev.GeneratedText != nil || ev.Details != nil || ev.Usage != nil) {
			tb.Fatalf("event %d of %d carries final fields: %+v", i, len(evs), ev)
		}
		if last && (ev.GeneratedText == nil || ev.Details == nil || ev.Usage == nil) {
			tb.Fatalf("last event lacks generated_text, details or usage: %+v", ev)
		}
		if !ev.Token.Special {
			text.WriteString(ev.Token.Text)
		}
	}
	last := evs[len(evs)-1]
	if *last.GeneratedText != text.String() {
		tb.Fatalf("generated_text %q, but the tokens say %q", *last.GeneratedText, text.String())
	}
	if last.Usage.CompletionTokens != last.Details.GeneratedTokens {
		tb.Fatalf("usage %+v vs details %+v", last.Usage, last.Details)
	}
	return text.String(), last
}

func TestTGIGenerate(t *testing.T) {
	s := mustOpenAPI(t, nil)
	const prompt = "Once upon a time"

	res := post(t, s.base+"/generate", map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 12, "details": true, "do_sample": false}})
	var r tgiResponse
	decodeBody(t, res, http.StatusOK, &r)
	d := r.Details
	if d == nil || d.FinishReason != "length" || d.GeneratedTokens != 12 || len(d.Tokens) != 12 || d.Seed != nil || d.Prefill == nil {
		t.Fatalf("details %+v", d)
	}
	var text strings.Builder
	for _, tok := range d.Tokens {
		text.WriteString(tok.Text)
	}
	if r.GeneratedText == "" || r.GeneratedText != text.String() {
		t.Fatalf("generated_text %q, tokens say %q", r.GeneratedText, text.String())
	}
	if res.Header.Get("X-Generated-Tokens") != "12" || res.Header.Get("X-Prompt-Tokens") == "" {
		t.Fatalf("TGI headers: %v", res.Header)
	}

	// Without details there are none; return_full_text prepends the prompt.
	plain := generate(t, s, prompt, map[string]any{"max_new_tokens": 12})
	if plain.Details != nil || plain.GeneratedText != r.GeneratedText {
		t.Fatalf("no details: %+v (want text %q)", plain, r.GeneratedText)
	}
	full := generate(t, s, prompt, map[string]any{"max_new_tokens": 12, "return_full_text": true})
	if full.GeneratedText != prompt+r.GeneratedText {
		t.Fatalf("return_full_text: %q", full.GeneratedText)
	}

	// top_n_tokens lists the sampled token (the only one the engine reports).
	top := generate(t, s, prompt, map[string]any{"max_new_tokens": 3, "details": true, "top_n_tokens": 2})
	if len(top.Details.TopTokens) != 3 || top.Details.TopTokens[0][0] != top.Details.Tokens[0] {
		t.Fatalf("top_tokens %+v", top.Details)
	}
}

func TestTGIStreamAndSageMaker(t *testing.T) {
	s := mustOpenAPI(t, nil)
	const prompt = "Once upon a time"
	params := map[string]any{"max_new_tokens": 12}
	want := generate(t, s, prompt, params).GeneratedText

	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{"/generate_stream", map[string]any{"inputs": prompt, "parameters": params}},
		{"/invocations", map[string]any{"inputs": prompt, "parameters": params, "stream": true}},
	} {
		evs := stream(t, s, c.path, c.body)
		text, last := checkStream(t, evs)
		// The reply ended on its cap, so the last event is the 12th token.
		if len(evs) != 12 || last.Token.Special || last.Details.FinishReason != "length" || last.Details.GeneratedTokens != 12 {
			t.Fatalf("%s: %d events, last %+v %+v", c.path, len(evs), last.Token, last.Details)
		}
		if text != want {
			t.Fatalf("%s streamed %q, /generate said %q", c.path, text, want)
		}
	}

	// SageMaker without stream: [{"generated_text": ...}].
	var arr []tgiResponse
	decodeBody(t, post(t, s.base+"/invocations", map[string]any{"inputs": prompt, "parameters": params}), http.StatusOK, &arr)
	if len(arr) != 1 || arr[0].GeneratedText != want {
		t.Fatalf("invocations: %+v, want %q", arr, want)
	}
}

func TestTGIStopSequence(t *testing.T) {
	s := mustOpenAPI(t, nil)
	const prompt = "Once upon a time"
	full := generate(t, s, prompt, map[string]any{"max_new_tokens": 40}).GeneratedText
	// A stop string from the middle of the greedy reply: the reply must end
	// right before its first occurrence.
	words := strings.Fields(full)
	if len(words) < 6 {
		t.Fatalf("reply too short to pick a stop string: %q", full)
	}
	stop := " " + words[len(words)/2]
	idx := strings.Index(full, stop)
	want := full[:idx]

	r := generate(t, s, prompt, map[string]any{"max_new_tokens": 40, "stop": []string{stop}, "details": true})
	if r.GeneratedText != want || r.Details.FinishReason != "stop_sequence" {
		t.Fatalf("stop %q: got %q (%s), want %q", stop, r.GeneratedText, r.Details.FinishReason, want)
	}

	evs := stream(t, s, "/generate_stream", map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 40, "stop": stop}})
	text, last := checkStream(t, evs)
	if text != want || last.Details.FinishReason != "stop_sequence" {
		t.Fatalf("stream with stop %q: %q (%s), want %q", stop, text, last.Details.FinishReason, want)
	}
	// The stream ended on a stop string, not its cap: the last event is the end marker.
	if !last.Token.Special || last.Token.Text != "" {
		t.Fatalf("last event token %+v, want the special end marker", last.Token)
	}
}

func TestTGISeedReproducible(t *testing.T) {
	s := mustOpenAPI(t, nil)
	const prompt = "The little dog"
	sampled := func(seed any) tgiResponse {
		p := map[string]any{"max_new_tokens": 24, "temperature": 1.2, "top_k": 0, "top_p": 1, "min_p": 0, "details": true}
		if seed != nil {
			p["seed"] = seed
		}
		return generate(t, s, prompt, p)
	}
	a, b := sampled(42), sampled(42)
	if a.GeneratedText != b.GeneratedText {
		t.Fatalf("seed 42 twice: %q vs %q", a.GeneratedText, b.GeneratedText)
	}
	if a.Details.Seed == nil || *a.Details.Seed != 42 {
		t.Fatalf("details.seed %v, want 42", a.Details.Seed)
	}
	differs := false
	for seed := 1; seed <= 4 && !differs; seed++ {
		differs = sampled(seed).GeneratedText != a.GeneratedText
	}
	if !differs {
		t.Fatalf("seeds 1-4 all sampled %q, as seed 42 did: is the seed applied?", a.GeneratedText)
	}
	// A request without a seed is told the one it got, and can replay it.
	r := sampled(nil)
	if r.Details.Seed == nil {
		t.Fatal("a sampled reply without a seed reports none")
	}
	if again := sampled(*r.Details.Seed); again.GeneratedText != r.GeneratedText {
		t.Fatalf("replaying seed %d: %q vs %q", *r.Details.Seed, again.GeneratedText, r.GeneratedText)
	}
}

func TestTGIGrammar(t *testing.T) {
	s := mustOpenAPI(t, nil)
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"ok":   map[string]any{"type": "boolean"},
			"size": map[string]any{"type": "string", "enum": []string{"big", "small"}},
		},
		"required":             []string{"ok", "size"},
		"additionalProperties": false,
	}
	r := generate(t, s, "Once upon a time", map[string]any{"max_new_tokens": 80, "details": true, "grammar": map[string]any{"type": "json", "value": schema}})
	var got map[string]any
	if err := json.Unmarshal([]byte(r.GeneratedText), &got); err != nil {
		t.Fatalf("not JSON: %q (%s): %v", r.GeneratedText, r.Details.FinishReason, err)
	}
	if _, ok := got["ok"].(bool); !ok || (got["size"] != "big" && got["size"] != "small") || len(got) != 2 {
		t.Fatalf("JSON does not match the schema: %v", got)
	}
	if r.Details.FinishReason != "eos_token" {
		t.Fatalf("finish %q: a complete grammar should end the reply", r.Details.FinishReason)
	}

	g := generate(t, s, "Once upon a time", map[string]any{"max_new_tokens": 10, "grammar": `root ::= "yes" | "no"`})
	if g.GeneratedText != "yes" && g.GeneratedText != "no" {
		t.Fatalf("GBNF yes|no gave %q", g.GeneratedText)
	}
}

func TestTGIValidation(t *testing.T) {
	s := mustOpenAPI(t, nil)
	stops := make([]string, 17)
	for i := range stops {
		stops[i] = fmt.Sprint("s", i)
	}
	withParams := func(p map[string]any) map[string]any { return map[string]any{"inputs": "Hello", "parameters": p} }
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		field  string
	}{
		{"no inputs", "/generate", map[string]any{}, 400, "inputs"},
		{"empty inputs", "/generate", map[string]any{"inputs": "  "}, 400, "inputs"},
		{"inputs a number", "/generate", map[string]any{"inputs": 5}, 400, "inputs"},
		{"invalid JSON", "/generate", `{"inputs":`, 400, ""},
		{"temperature a string", "/generate", withParams(map[string]any{"temperature": "hot"}), 400, "parameters.temperature"},
		{"temperature NaN as a string", "/generate_stream", withParams(map[string]any{"temperature": "NaN"}), 400, "parameters.temperature"},
		{"temperature negative", "/generate", withParams(map[string]any{"temperature": -1}), 400, "parameters.temperature"},
		{"temperature huge", "/invocations", withParams(map[string]any{"temperature": 1e300}), 400, "parameters.temperature"},
		{"top_p over 1", "/generate", withParams(map[string]any{"top_p": 1.5}), 400, "parameters.top_p"},
		{"top_k negative", "/generate", withParams(map[string]any{"top_k": -1}), 400, "parameters.top_k"},
		{"typical_p over 1", "/generate", withParams(map[string]any{"typical_p": 2}), 400, "parameters.typical_p"},
		{"repetition_penalty 0", "/generate", withParams(map[string]any{"repetition_penalty": 0}), 400, "parameters.repetition_penalty"},
		{"max_new_tokens 0", "/generate", withParams(map[string]any{"max_new_tokens": 0}), 400, "parameters.max_new_tokens"},
		{"max_new_tokens over the cap", "/generate_stream", withParams(map[string]any{"max_new_tokens": 100000}), 400, "parameters.max_new_tokens"},
		{"max_new_tokens a string", "/generate", withParams(map[string]any{"max_new_tokens": "many"}), 400, "parameters.max_new_tokens"},
		{"seed negative", "/generate", withParams(map[string]any{"seed": -5}), 400, "parameters.seed"},
		{"seed huge", "/generate", withParams(map[string]any{"seed": 1e10}), 400, "parameters.seed"},
		{"manual_seed too big", "/generate", withParams(map[string]any{"manual_seed": 1 << 33}), 400, "parameters.manual_seed"},
		{"too many stops", "/generate", withParams(map[string]any{"stop": stops}), 400, "parameters.stop"},
		{"empty stop", "/generate", withParams(map[string]any{"stop": []string{""}}), 400, "parameters.stop"},
		{"stop a number", "/generate", withParams(map[string]any{"stop": 5}), 400, "parameters.stop"},
		{"grammar that does not parse", "/generate", withParams(map[string]any{"grammar": "root ::= nope"}), 400, "parameters.grammar"},
		{"regex grammar", "/generate", withParams(map[string]any{"grammar": map[string]any{"type": "regex", "value": "a+"}}), 400, "parameters.grammar"},
		{"schema not JSON", "/generate", withParams(map[string]any{"grammar": map[string]any{"type": "json", "value": "{nope"}}), 400, "parameters.grammar.value"},
		{"best_of 2", "/generate", withParams(map[string]any{"best_of": 2}), 400, "parameters.best_of"},
		{"top_n_tokens huge", "/generate", withParams(map[string]any{"top_n_tokens": 99}), 400, "parameters.top_n_tokens"},
		{"unknown format", "/generate?format=xml", withParams(nil), 400, "format"},
		{"prompt longer than the context", "/generate", map[string]any{"inputs": strings.Repeat("the dog ran ", 400)}, 413, ""},
		{"body over the limit", "/generate", map[string]any{"inputs": strings.Repeat("a", 5<<20)}, 413, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := wantFieldError(t, post(t, s.base+c.path, c.body), c.status, c.field)
			// TGI's shape on TGI's routes; Parley's on the JSON-lines form.
			if strings.Contains(c.path, "format=") {
				if c.status == 400 && e.Error.Code != "invalid" {
					t.Fatalf("code %q for status %d", e.Error.Code, c.status)
				}
			} else if e.shape != "tgi" || e.Error.Type != "validation" {
				t.Fatalf("want TGI's error with error_type validation, got %+v", e)
			}
		})
	}
	// The server still answers.
	if r := generate(t, s, "Hello", map[string]any{"max_new_tokens": 3}); r.GeneratedText == "" {
		t.Fatal("no reply after the bad requests")
	}
}

func TestTGIDisconnectCancelsGeneration(t *testing.T) {
	s := mustOpenAPI(t, nil)
	res := post(t, s.base+"/generate_stream", map[string]any{"inputs": "Once upon a time", "parameters": map[string]any{"max_new_tokens": 480}})
	buf := make([]byte, 64)
	if _, err := res.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	res.Body.Close() // the client goes away after the first event
	s.waitIdle(t)
	var logs []map[string]any
	waitFor(hangWait, func() bool { logs = s.replyLogs("tgi-stream"); return len(logs) > 0 })
	if len(logs) != 1 || logs[0]["finish"] != "cancelled" || logs[0]["reply_tokens"].(int64) >= 480 {
		t.Fatalf("reply log %v: want one cancelled reply short of 480 tokens", logs)
	}
	// The slot is free for the next request at once.
	if r := generate(t, s, "Hello", map[string]any{"max_new_tokens": 3}); r.GeneratedText == "" {
		t.Fatal("no reply after the disconnect")
	}
}
