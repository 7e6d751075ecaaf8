package web_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/web"
)

// post sends body (a string as is, anything else as JSON) and returns the response.
func post(tb testing.TB, url string, body any, hdr ...string) *http.Response {
	tb.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(http.MethodPost, url, r)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	tb.Cleanup(func() { res.Body.Close() })
	return res
}

// decodeBody decodes a JSON response, failing on a status other than want.
func decodeBody(tb testing.TB, res *http.Response, want int, v any) {
	tb.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	if res.StatusCode != want {
		tb.Fatalf("status %d, want %d: %s", res.StatusCode, want, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		tb.Fatalf("decode %s: %v", b, err)
	}
}

// errorBody is the JSON error an endpoint returns before streaming, in any
// of the three shapes: Parley's {"error": {code, message, field}}, OpenAI's
// {"error": {message, type, param, code}} (param read into Field) and TGI's
// {"error": "...", "error_type": "..."} (read into Message and Type).
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
		Type    string `json:"type"`
	} `json:"error"`
	shape string // "parley", "openai" or "tgi"
}

func (e *errorBody) UnmarshalJSON(b []byte) error {
	var raw struct {
		Error     json.RawMessage `json:"error"`
		ErrorType *string         `json:"error_type"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw.ErrorType != nil {
		e.shape, e.Error.Type = "tgi", *raw.ErrorType
		return json.Unmarshal(raw.Error, &e.Error.Message)
	}
	var obj struct {
		Code    *string `json:"code"`
		Message string  `json:"message"`
		Field   string  `json:"field"`
		Param   *string `json:"param"`
		Type    *string `json:"type"`
	}
	if err := json.Unmarshal(raw.Error, &obj); err != nil {
		return err
	}
	e.shape = "parley"
	if obj.Type != nil {
		e.shape, e.Error.Type = "openai", *obj.Type
		if obj.Param != nil {
			e.Error.Field = *obj.Param
		}
	} else {
		e.Error.Field = obj.Field
	}
	if obj.Code != nil {
		e.Error.Code = *obj.Code
	}
	e.Error.Message = obj.Message
	return nil
}

// wantFieldError checks a 400 (or want) whose error names field (TGI's
// errors have no field of their own: their message names it).
func wantFieldError(tb testing.TB, res *http.Response, want int, field string) errorBody {
	tb.Helper()
	var e errorBody
	decodeBody(tb, res, want, &e)
	if e.Error.Message == "" {
		tb.Fatalf("error without a message: %+v", e)
	}
	if e.shape == "tgi" {
		if field != "" && !strings.Contains(e.Error.Message, field) {
			tb.Fatalf("error message %q does not name %q", e.Error.Message, field)
		}
		return e
	}
	if field != "" && (e.Error.Field != field || !strings.Contains(e.Error.Message, field)) {
		tb.Fatalf("error names field %q (message %q), want %q", e.Error.Field, e.Error.Message, field)
	}
	return e
}

// readSSE reads a server-sent event stream and returns each event's data,
// checking the framing byte for byte: every event is one line
// "<prefix><data>\n" followed by exactly one empty line, the framing that
// newline-splitting clients (SageMaker's examples) depend on.
func readSSE(tb testing.TB, r io.Reader, prefix string) []string {
	tb.Helper()
	br := bufio.NewReader(r)
	var out []string
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			return out
		}
		if err != nil {
			tb.Fatalf("read event %d: %v (partial %q)", len(out), err, line)
		}
		if !strings.HasPrefix(line, prefix) {
			tb.Fatalf("event %d: line %q does not start with %q", len(out), line, prefix)
		}
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(line, prefix), "\n"))
		blank, err := br.ReadString('\n')
		if blank != "\n" {
			tb.Fatalf("event %d: want one empty line after it, got %q (%v)", len(out), blank, err)
		}
	}
}

// TestStreamErrorAfterStart: a reply that fails after its stream began ends
// with the format's own error event or line, not a truncated stream. The
// engine is closed under a running reply (as a crash or a shutdown would).
func TestStreamErrorAfterStart(t *testing.T) {
	long := map[string]any{"inputs": "Once upon a time", "parameters": map[string]any{"max_new_tokens": 480}}
	cases := []struct {
		name, path string
		body       any
		check      func(t *testing.T, rest string)
	}{
		{"tgi", "/generate_stream", long, func(t *testing.T, rest string) {
			evs := strings.Split(strings.TrimSpace(rest), "\n\n")
			var last struct {
				Error     string `json:"error"`
				ErrorType string `json:"error_type"`
			}
			json.Unmarshal([]byte(strings.TrimPrefix(evs[len(evs)-1], "data:")), &last)
			if !strings.Contains(last.Error, "shutting down") || last.ErrorType != "overloaded" {
				t.Fatalf("last event %q", evs[len(evs)-1])
			}
		}},
		{"jsonlines", "/generate?format=jsonlines", long, func(t *testing.T, rest string) {
			lines := strings.Split(strings.TrimSpace(rest), "\n")
			var last struct {
				FinishReason string `json:"finish_reason"`
				Error        *struct{ Code string }
			}
			json.Unmarshal([]byte(lines[len(lines)-1]), &last)
			if last.FinishReason != "cancelled" || last.Error == nil || last.Error.Code != "unavailable" {
				t.Fatalf("last line %q", lines[len(lines)-1])
			}
		}},
		{"openai", "/v1/chat/completions", map[string]any{"messages": userMsgs("Hi"), "max_tokens": 400, "stream": true}, func(t *testing.T, rest string) {
			evs := strings.Split(strings.TrimSpace(rest), "\n\n")
			var last struct {
				Error *struct{ Message, Code string }
			}
			json.Unmarshal([]byte(strings.TrimPrefix(evs[len(evs)-1], "data: ")), &last)
			if last.Error == nil || last.Error.Code != "unavailable" || strings.Contains(rest, "[DONE]") {
				t.Fatalf("last event %q", evs[len(evs)-1])
			}
		}},
		{"plain", "/?prompt=Once&max_tokens=480", nil, func(t *testing.T, rest string) {
			if !strings.HasSuffix(rest, "\nError: the reply was cancelled: the server is shutting down\n") {
				t.Fatalf("plain stream ends %q", rest[max(0, len(rest)-80):])
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustOpenAPI(t, nil)
			res := post(t, s.base+c.path, c.body)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d", res.StatusCode)
			}
			first := make([]byte, 1)
			if _, err := io.ReadFull(res.Body, first); err != nil {
				t.Fatal(err)
			}
			s.engine.Close()
			rest, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, string(first)+string(rest))
		})
	}
}

// TestPromptTokenCap: every API refuses a prompt over Config.MaxPromptTokens
// with 413 too_large, before it reaches the engine.
func TestAPIPromptTokenCap(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.MaxPromptTokens = 20 })
	long := strings.Repeat("The cat sat on the mat. ", 10)
	for _, c := range []struct {
		path string
		body any
	}{
		{"/?max_tokens=3", long},
		{"/generate", map[string]any{"inputs": long}},
		{"/generate_stream", map[string]any{"inputs": long}},
		{"/generate?format=jsonlines", map[string]any{"inputs": long}},
	} {
		e := wantFieldError(t, post(t, s.base+c.path, c.body), http.StatusRequestEntityTooLarge, "")
		if e.Error.Code != "too_large" && !(e.shape == "tgi" && e.Error.Type == "validation") {
			t.Fatalf("%s: %+v", c.path, e)
		}
	}
	// OpenAI's routes answer as OpenAI answers a prompt over the context
	// window: a 400 context_length_exceeded, which its clients recognise.
	for _, c := range []struct {
		path string
		body any
	}{
		{"/v1/chat/completions", map[string]any{"messages": userMsgs(long)}},
		{"/v1/responses", map[string]any{"input": long}},
		{"/v1/completions", map[string]any{"prompt": long}},
	} {
		e := wantFieldError(t, post(t, s.base+c.path, c.body), http.StatusBadRequest, "")
		if e.shape != "openai" || e.Error.Code != "context_length_exceeded" || e.Error.Type != "invalid_request_error" ||
			!strings.HasPrefix(e.Error.Message, "This model's maximum context length is 20 tokens. However, your messages resulted in ") {
			t.Fatalf("%s: %+v", c.path, e)
		}
	}
	if s.engine.Stats().PromptEvaluated != 0 {
		t.Fatalf("refused prompts reached the engine: %+v", s.engine.Stats())
	}
	if r := generate(t, s, "The cat", map[string]any{"max_new_tokens": 3}); r.GeneratedText == "" {
		t.Fatal("a short prompt was refused")
	}
}
