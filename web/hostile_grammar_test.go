package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
)

// TestHostileGrammars sends, through the OpenAI and TGI endpoints and the
// real engine, each grammar and schema that used to abort, exhaust or
// freeze the process. Each is refused with a 400 that says why, or (a
// grammar that dead-ends after its first token) ends with an error; the
// server then answers a normal prompt.
func TestHostileGrammars(t *testing.T) {
	s := mustOpenAPI(t, nil)
	nested := "root ::= a0\n"
	for i := range 30 {
		n, m := string(rune('a'+i%26))+string(rune('a'+i/26)), string(rune('a'+(i+1)%26))+string(rune('a'+(i+1)/26))
		if i == 0 {
			n = "a0"
		}
		nested += n + ` ::= ("x" | "") ` + m + " " + m + "\n"
	}
	nested += string(rune('a'+30%26)) + string(rune('a'+30/26)) + " ::= \"y\" | \"\"\n"
	cases := []struct {
		name  string
		extra map[string]any // OpenAI request fields
		want  string         // in the error message
	}{
		{"empty class", map[string]any{"grammar": `root ::= "a" []`}, "empty"},
		{"max below min", map[string]any{"grammar": `root ::= "a"{5,2}`}, "maximum below its minimum"},
		{"huge bound", map[string]any{"grammar": `root ::= "a"{0,18446744073709551615}`}, "above 2000"},
		{"nested nullable alternatives", map[string]any{"grammar": nested}, "too many ways"},
		{"minLength over maxLength", map[string]any{"json_schema": json.RawMessage(`{"type":"string","minLength":9,"maxLength":3}`)}, "minLength"},
		{"minItems over maxItems", map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(`{"type":"array","minItems":4,"maxItems":2}`)}}}, "minItems"},
		{"integer with no valid number", map[string]any{"json_schema": json.RawMessage(`{"type":"integer","minimum":15,"maximum":12}`)}, "empty"},
		{"integer between exclusive bounds", map[string]any{"json_schema": json.RawMessage(`{"type":"integer","exclusiveMinimum":15,"exclusiveMaximum":16}`)}, "no integer"},
		{"lookahead pattern", map[string]any{"json_schema": json.RawMessage(`{"type":"string","pattern":"^(?!a)b$"}`)}, "(?...)"},
		{"POSIX class pattern", map[string]any{"json_schema": json.RawMessage(`{"type":"string","pattern":"^[[:alpha:]]+$"}`)}, "POSIX"},
	}
	for _, c := range cases {
		body := map[string]any{"messages": []map[string]any{{"role": "user", "content": "Once upon a time"}}, "max_tokens": 8}
		for k, v := range c.extra {
			body[k] = v
		}
		e := wantFieldError(t, post(t, s.base+"/v1/chat/completions", body), http.StatusBadRequest, "")
		if !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s: error %q does not say %q", c.name, e.Error.Message, c.want)
		}
	}
	// TGI's grammar parameter takes the same checks.
	res := post(t, s.base+"/generate", map[string]any{"inputs": "Once", "parameters": map[string]any{"grammar": map[string]any{"type": "json", "value": json.RawMessage(`{"type":"string","maxLength":1,"minLength":2}`)}}})
	wantFieldError(t, res, http.StatusBadRequest, "")

	// A grammar that allows a first token and then none ends with an error.
	res = post(t, s.base+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Once"}}, "max_tokens": 8, "grammar": `root ::= "a" <[99999]>`})
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusOK || !strings.Contains(string(b), "allows no token") {
		t.Errorf("dead-end grammar: status %d %s", res.StatusCode, b)
	}

	var ok struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	decodeBody(t, post(t, s.base+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Once upon a time"}}, "max_tokens": 8}), http.StatusOK, &ok)
	if len(ok.Choices) != 1 || ok.Choices[0].Message.Content == "" {
		t.Fatalf("normal prompt after the hostile grammars: %+v", ok)
	}
}

// TestCostlyGrammarsAreRefusedOnEveryAPI: a grammar or schema of nested
// repetitions over shared characters (the family of the live grammar tests) is refused with
// a 400 that says it is too costly to match, on every API, fast; never a
// 500.
func TestCostlyGrammarsAreRefusedOnEveryAPI(t *testing.T) {
	s := mustOpenAPI(t, nil)
	const g = `root ::= ([a-z ]{0,1000}){0,500}`
	schema := json.RawMessage(`{"type":"string","pattern":"^([a-z]{0,1000}){0,500}$"}`)
	msgs := []map[string]any{{"role": "user", "content": "Once upon a time"}}
	for _, c := range []struct {
		api, path string
		body      map[string]any
	}{
		{"openai chat", "/v1/chat/completions", map[string]any{"messages": msgs, "grammar": g}},
		{"openai chat schema", "/v1/chat/completions", map[string]any{"messages": msgs, "response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": schema}}}},
		{"openai chat stream", "/v1/chat/completions", map[string]any{"messages": msgs, "grammar": g, "stream": true}},
		{"openai completions", "/v1/completions", map[string]any{"prompt": "Once", "grammar": g}},
		{"tgi", "/generate", map[string]any{"inputs": "Once", "parameters": map[string]any{"grammar": g}}},
		{"tgi schema", "/generate", map[string]any{"inputs": "Once", "parameters": map[string]any{"grammar": map[string]any{"type": "json", "value": schema}}}},
		{"responses", "/v1/responses", map[string]any{"input": "Once upon a time", "grammar": g}},
	} {
		res := post(t, s.base+c.path, c.body)
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "too costly to match") {
			t.Errorf("%s: status %d %s", c.api, res.StatusCode, b)
		}
		// Fast: refused by the static check (it names llama.cpp's parse
		// stacks or paths), before any sampler runs, not by the step
		// budget after one did. Which check refused, not a time.
		if strings.Contains(string(b), "step budget") || !strings.Contains(string(b), "parse") {
			t.Errorf("%s: not refused by the static check: %s", c.api, b)
		}
	}
	ws := dial(t, strings.Replace(s.base, "http", "ws", 1)+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"grammar": g}})
	if _, m := readUntilDone(t, ws); m.Type != "error" || m.Code != parley.EInvalid || !strings.Contains(m.Message, "too costly to match") {
		t.Errorf("websocket json mode: %+v", m)
	}
}
