package web_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/gbnf"
)

// wideSchema is an object of n properties p0..p(n-1) of mixed types; the
// first `required` of them are required.
func wideSchema(n, required int) map[string]any {
	props := map[string]any{}
	var req []string
	types := []map[string]any{
		{"type": "string", "maxLength": 12},
		{"type": "integer", "minimum": 0, "maximum": 999},
		{"type": "boolean"},
		{"enum": []string{"red", "green"}},
	}
	for i := range n {
		props[fmt.Sprintf("p%d", i)] = types[i%len(types)]
		if i < required {
			req = append(req, fmt.Sprintf("p%d", i))
		}
	}
	return map[string]any{"type": "object", "properties": props, "required": req, "additionalProperties": false}
}

// completeProperties cuts a JSON object cut short after its last complete
// property (before the last comma outside a string at the top level) and
// closes it.
func completeProperties(doc string) string {
	cut, depth, inStr := -1, 0, false
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		case c == ',' && depth == 1:
			cut = i
		}
	}
	if cut < 0 {
		return doc
	}
	return doc[:cut] + "}"
}

// orderedKeys returns the keys of the JSON object doc in document order.
func orderedKeys(t *testing.T, doc string) []string {
	dec := json.NewDecoder(strings.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("reply %q is not an object", doc)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("reply %q: %v", doc, err)
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("reply %q: %v", doc, err)
		}
	}
	return keys
}

// TestOpenAILargeSchemas: a 500-property schema generates through the chat
// completions route, and the reply is JSON matching it; schemas over a
// limit are refused with a 400 naming the limit, fast.
func TestOpenAILargeSchemas(t *testing.T) {
	s := mustOpenAPI(t, nil)
	ask := func(schema any, maxTokens int) *http.Response {
		return post(t, s.base+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Form:"}}, "max_tokens": maxTokens,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "form", "schema": schema}}})
	}

	// Go's map marshals the properties sorted by name (p0, p1, p10, p100,
	// ...): that is the order the reply must follow.
	t0 := time.Now()
	var c oaiCompletion
	decodeBody(t, ask(wideSchema(500, 6), 460), http.StatusOK, &c)
	elapsed := time.Since(t0)
	reply := c.Choices[0].Message.Content
	switch c.Choices[0].FinishReason {
	case "stop":
	case "length":
		// The tiny model walks through the optional properties until the
		// cap: check the properties it completed.
		reply = completeProperties(reply)
	default:
		t.Fatalf("500 properties: finish %q after %d tokens: %q", c.Choices[0].FinishReason, c.Usage.CompletionTokens, reply)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(reply), &obj); err != nil {
		t.Fatalf("500 properties: reply %q: %v", reply, err)
	}
	keys := orderedKeys(t, reply)
	var sorted []string
	for i := range 500 {
		sorted = append(sorted, fmt.Sprintf("p%d", i))
	}
	// Required first (in name order), then optional ones in name order.
	for i, k := range keys {
		var n int
		if _, err := fmt.Sscanf(k, "p%d", &n); err != nil || n >= 500 {
			t.Fatalf("reply has key %q", k)
		}
		if i < 6 && k != []string{"p0", "p1", "p2", "p3", "p4", "p5"}[i] {
			t.Fatalf("reply keys %q: the required ones do not come first", keys)
		}
		switch v := obj[k].(type) {
		case string:
			if n%4 == 0 && len([]rune(v)) > 12 || n%4 == 3 && v != "red" && v != "green" || n%4 == 1 || n%4 == 2 {
				t.Fatalf("%s = %q does not match its schema", k, v)
			}
		case float64:
			if n%4 != 1 || v < 0 || v > 999 || v != float64(int(v)) {
				t.Fatalf("%s = %v does not match its schema", k, v)
			}
		case bool:
			if n%4 != 2 {
				t.Fatalf("%s = %v does not match its schema", k, v)
			}
		default:
			t.Fatalf("%s = %v does not match its schema", k, v)
		}
	}
	t.Logf("500 properties: %d keys, %d tokens in %v: %.200s", len(keys), c.Usage.CompletionTokens, elapsed, reply)

	// 1000 properties (the limit) and 2000 leaves in 20 nested objects
	// convert and start generating.
	nested := map[string]any{}
	for i := range 20 {
		nested[fmt.Sprintf("g%d", i)] = wideSchema(100, 0)
	}
	for name, schema := range map[string]any{
		"1000 properties": wideSchema(1000, 2),
		"2000 leaves":     map[string]any{"type": "object", "properties": nested, "required": []string{"g0"}},
	} {
		var c oaiCompletion
		decodeBody(t, ask(schema, 40), http.StatusOK, &c)
		if !strings.HasPrefix(c.Choices[0].Message.Content, "{") {
			t.Fatalf("%s: reply %q", name, c.Choices[0].Message.Content)
		}
		t.Logf("%s: 40 tokens: %.100s", name, c.Choices[0].Message.Content)
	}

	// Over a limit: a 400 naming it, before the engine is asked for
	// anything (no prompt evaluated, no reply started: counted, not timed).
	deep := map[string]any{"type": "string"}
	for range 70 {
		deep = map[string]any{"type": "array", "items": deep}
	}
	for name, c := range map[string]struct {
		schema any
		want   string
	}{
		"1500 properties": {wideSchema(1500, 0), "at most 1000"},
		"5000 properties": {wideSchema(5000, 0), "limit on schema size"},
		"nested 70 deep":  {deep, "deep"},
		"lone surrogate":  {json.RawMessage(`{"enum":["ok","\ud800"]}`), "enum[1]"},
	} {
		before := s.engine.Stats()
		t0 := time.Now()
		e := wantFieldError(t, ask(c.schema, 10), http.StatusBadRequest, "response_format.json_schema.schema")
		d := time.Since(t0)
		after := s.engine.Stats()
		if !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s: refused with %q, want %q", name, e.Error.Message, c.want)
		}
		if after.PromptEvaluated != before.PromptEvaluated || after.TokensGenerated != before.TokensGenerated {
			t.Errorf("%s: the engine evaluated %d prompt tokens and generated %d before the refusal", name,
				after.PromptEvaluated-before.PromptEvaluated, after.TokensGenerated-before.TokensGenerated)
		}
		t.Logf("%s: refused in %v: %s", name, d, e.Error.Message)
	}
}

// TestLoneSurrogateGrammarRefused: a GBNF escape naming a lone surrogate is
// refused with a 400 naming the grammar (the model would have emitted the
// surrogate's bytes, which are not UTF-8).
func TestLoneSurrogateGrammarRefused(t *testing.T) {
	s := mustOpenAPI(t, nil)
	for _, g := range []string{`root ::= "\ud800"`, `root ::= [\udc00-\udfff]+`, `root ::= "a" "\U0000DBFF"`} {
		e := wantFieldError(t, post(t, s.base+"/v1/chat/completions", map[string]any{"messages": userMsgs("Hi"), "grammar": g}), http.StatusBadRequest, "grammar")
		if !strings.Contains(e.Error.Message, "surrogate") {
			t.Errorf("%s: %q does not say why", g, e.Error.Message)
		}
	}
}

// TestSchemaConvertedOnce: a request's JSON schema is converted to a grammar
// once (a 500-property one takes ~100 ms), though the web edge, the session
// and the engine each validate the request's parameters. Both APIs whose
// requests pass through Service.Turn and Service.Respond are checked,
// streamed and not.
func TestSchemaConvertedOnce(t *testing.T) {
	s := mustOpenAPI(t, nil)
	schema := wideSchema(20, 2)
	for name, c := range map[string]struct {
		path string
		body map[string]any
	}{
		"chat completions": {"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Form:"}}, "max_tokens": 8,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "form", "schema": schema}}}},
		"chat completions streamed": {"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Form:"}}, "max_tokens": 8, "stream": true,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "form", "schema": schema}}}},
		"responses": {"/v1/responses", map[string]any{"input": "Form:", "max_output_tokens": 8,
			"text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "form", "schema": schema}}}},
		"responses streamed": {"/v1/responses", map[string]any{"input": "Form:", "max_output_tokens": 8, "stream": true,
			"text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "form", "schema": schema}}}},
	} {
		before := gbnf.Conversions()
		res := post(t, s.base+c.path, c.body)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s (%v)", name, res.StatusCode, body, err)
		}
		s.waitIdle(t)
		if n := gbnf.Conversions() - before; n != 1 {
			t.Errorf("%s: the schema was converted %d times, want once", name, n)
		}
	}
}
