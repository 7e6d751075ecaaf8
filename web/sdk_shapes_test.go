package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// zodPerson is what zod 4's toJSONSchema writes for
// z.object({name: z.string(), age: z.number().int().nonnegative(),
// mood: z.enum(["happy", "sad"]), tags: z.array(z.string()).max(2),
// pet: z.object({kind: z.string(), legs: z.number().int()})}): integer
// bounds at ±(2^53-1) that mean "any integer".
const zodPerson = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{
"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":9007199254740991},
"mood":{"type":"string","enum":["happy","sad"]},"tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":2},
"pet":{"type":"object","properties":{"kind":{"type":"string","maxLength":8},"legs":{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}},
"required":["kind","legs"],"additionalProperties":false}},"required":["name","age","mood","tags","pet"],"additionalProperties":false}`

// checkPerson checks that text is a JSON object with zodPerson's keys, in order.
func checkPerson(tb testing.TB, text string) {
	tb.Helper()
	var v struct {
		Name string   `json:"name"`
		Age  int64    `json:"age"`
		Mood string   `json:"mood"`
		Tags []string `json:"tags"`
		Pet  struct {
			Kind string `json:"kind"`
			Legs int64  `json:"legs"`
		} `json:"pet"`
	}
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		tb.Fatalf("reply %q is not the schema's JSON: %v", text, err)
	}
	if v.Age < 0 || (v.Mood != "happy" && v.Mood != "sad") || len(v.Tags) > 2 {
		tb.Fatalf("reply %q breaks the schema", text)
	}
	if i, j := strings.Index(text, `"name"`), strings.Index(text, `"pet"`); i < 0 || j < i {
		tb.Fatalf("reply %q does not keep the schema's property order", text)
	}
}

// TestStructuredOutputUnboundedIntegers: zod's "any integer" bounds are
// accepted on chat completions (response_format) and Responses
// (text.format), and the grammar they convert to forces the schema's JSON.
func TestStructuredOutputUnboundedIntegers(t *testing.T) {
	s := mustOpenAPI(t, nil)
	schema := json.RawMessage(zodPerson)
	c := chatComplete(t, s, map[string]any{"messages": userMsgs("Describe a person."), "max_tokens": 400, "temperature": 0,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "strict": true, "schema": schema}}})
	if c.Choices[0].FinishReason != "stop" {
		t.Logf("%s", c.Choices[0].Message.Content)
		t.Fatalf("finish %q: the grammar should end the reply", c.Choices[0].FinishReason)
	}
	checkPerson(t, c.Choices[0].Message.Content)

	format := map[string]any{"type": "json_schema", "name": "person", "strict": true, "schema": schema}
	r := createResponse(t, s, map[string]any{"input": "Describe a person.", "max_output_tokens": 400, "temperature": 0,
		"text": map[string]any{"format": format}})
	checkPerson(t, r.text())
	var echoed struct {
		Text struct {
			Format struct{ Type, Name string } `json:"format"`
		} `json:"text"`
	}
	res := post(t, s.base+"/v1/responses", map[string]any{"input": "Describe a person.", "max_output_tokens": 400, "temperature": 0,
		"text": map[string]any{"format": format}})
	decodeBody(t, res, http.StatusOK, &echoed)
	if echoed.Text.Format.Type != "json_schema" || echoed.Text.Format.Name != "person" {
		t.Fatalf("text not echoed: %+v", echoed)
	}
}

// keysOf is the sorted key set of a JSON object.
func keysOf(tb testing.TB, raw json.RawMessage) []string {
	tb.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		tb.Fatalf("%s: %v", raw, err)
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestOutputTextParts: every output_text part carries annotations and
// logprobs (empty arrays), as OpenAI's schema requires and the AI SDK's
// parser insists; input_text parts carry neither.
func TestOutputTextParts(t *testing.T) {
	s := mustOpenAPI(t, nil)
	var o struct {
		AccessPrograms *json.RawMessage `json:"access_programs"`
		Output         []struct {
			Content []json.RawMessage `json:"content"`
		} `json:"output"`
	}
	raw := post(t, s.base+"/v1/responses", map[string]any{"input": "Once upon a time", "max_output_tokens": 4})
	b, _ := io.ReadAll(raw.Body)
	if err := json.Unmarshal(b, &o); err != nil || len(o.Output) != 1 || len(o.Output[0].Content) != 1 {
		t.Fatalf("response %s: %v", b, err)
	}
	if !strings.Contains(string(b), `"access_programs":null`) {
		t.Fatalf("no access_programs: %s", b)
	}
	if got := keysOf(t, o.Output[0].Content[0]); !slices.Equal(got, []string{"annotations", "logprobs", "text", "type"}) {
		t.Fatalf("output_text part keys %v: %s", got, o.Output[0].Content[0])
	}

	res := post(t, s.base+"/v1/responses", map[string]any{"input": "Once upon a time", "max_output_tokens": 4, "stream": true})
	for _, ev := range readResponseEvents(t, res.Body) {
		if p, ok := ev.data["part"].(map[string]any); ok {
			if _, a := p["annotations"].([]any); !a {
				t.Fatalf("%s: part without annotations: %v", ev.name, p)
			}
			if _, l := p["logprobs"].([]any); !l {
				t.Fatalf("%s: part without logprobs: %v", ev.name, p)
			}
		}
	}
	var conv convObject
	decodeBody(t, post(t, s.base+"/v1/conversations", `{"items":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}`), http.StatusOK, &conv)
	var items struct {
		Data []struct {
			Role    string            `json:"role"`
			Content []json.RawMessage `json:"content"`
		} `json:"data"`
	}
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/conversations/"+conv.ID+"/items?order=asc", nil), http.StatusOK, &items)
	if len(items.Data) != 2 {
		t.Fatalf("items %+v", items)
	}
	if got := keysOf(t, items.Data[0].Content[0]); !slices.Equal(got, []string{"text", "type"}) {
		t.Fatalf("input_text keys %v", got)
	}
	if got := keysOf(t, items.Data[1].Content[0]); !slices.Equal(got, []string{"annotations", "logprobs", "text", "type"}) {
		t.Fatalf("output_text keys %v", got)
	}
}

// TestErrorShapes: OpenAI's routes answer {"error": {message, type, param,
// code}} with param the field the client sent; TGI's answer {"error",
// "error_type"}; Parley's own keep {"error": {code, message, field}}.
func TestErrorShapes(t *testing.T) {
	s := mustOpenAPI(t, nil)
	body := func(res *http.Response, want int) map[string]any {
		t.Helper()
		var m map[string]any
		decodeBody(t, res, want, &m)
		return m
	}
	for _, tc := range []struct {
		path  string
		body  any
		param string
	}{
		{"/v1/chat/completions", map[string]any{"messages": userMsgs("hi"), "max_completion_tokens": -1}, "max_completion_tokens"},
		{"/v1/chat/completions", map[string]any{"messages": userMsgs("hi"), "max_tokens": 0}, "max_tokens"},
		{"/v1/completions", map[string]any{"prompt": "hi", "temperature": "hot"}, "temperature"},
		{"/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 0}, "max_output_tokens"},
		{"/v1/responses", map[string]any{"input": []map[string]any{{"role": "user", "content": []any{}}}}, "input[0].content"},
	} {
		m := body(post(t, s.base+tc.path, tc.body), http.StatusBadRequest)
		e, _ := m["error"].(map[string]any)
		if got := keysOf(t, mustJSON(t, e)); !slices.Equal(got, []string{"code", "message", "param", "type"}) {
			t.Fatalf("%s: error keys %v: %v", tc.path, got, m)
		}
		if e["param"] != tc.param || e["type"] != "invalid_request_error" || e["code"] != "invalid" {
			t.Fatalf("%s: %v, want param %s", tc.path, e, tc.param)
		}
	}
	m := body(do(t, http.MethodGet, s.base+"/v1/models/nope", nil), http.StatusNotFound)
	if e := m["error"].(map[string]any); e["param"] != nil || e["type"] != "invalid_request_error" || e["code"] != "not_found" {
		t.Fatalf("models: %v", m)
	}

	m = body(post(t, s.base+"/generate", map[string]any{"inputs": "hi", "parameters": map[string]any{"temperature": -1}}), http.StatusBadRequest)
	if m["error_type"] != "validation" || !strings.Contains(m["error"].(string), "parameters.temperature") {
		t.Fatalf("tgi: %v", m)
	}

	m = body(post(t, s.base+"/?prompt=hi&temperature=-1", nil), http.StatusBadRequest)
	if e := m["error"].(map[string]any); e["field"] != "temperature" || e["code"] != "invalid" {
		t.Fatalf("plain: %v", m)
	}
}

func mustJSON(tb testing.TB, v any) json.RawMessage {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
