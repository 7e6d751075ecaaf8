package web_test

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/testimage"
	"github.com/parley-chat/parley/media"
	"github.com/parley-chat/parley/web"
)

// TestResponsesWebSocketOutlivesPongWait: a response that runs longer than
// the pong wait does not cost its socket: the handler does not read while
// a response runs (pongs wait unread), and the next request on the same
// socket is still answered.
func TestResponsesWebSocketOutlivesPongWait(t *testing.T) {
	const pongWait = 150 * time.Millisecond
	s := mustOpenAPI(t, func(c *web.Config) { c.PongWait = pongWait })
	ws := dial(t, s.url+"/v1/responses", nil)
	respond := func(tokens int) (time.Duration, map[string]any) {
		t.Helper()
		t0 := time.Now()
		if err := ws.WriteJSON(map[string]any{"type": "response.create", "input": "Once upon a time", "max_output_tokens": tokens,
			"temperature": 0, "text": map[string]any{"format": map[string]any{"type": "json_object"}}}); err != nil {
			t.Fatal(err)
		}
		for {
			var m map[string]any
			ws.SetReadDeadline(time.Now().Add(hangWait))
			if err := ws.ReadJSON(&m); err != nil {
				t.Fatalf("socket lost after %v: %v", time.Since(t0), err)
			}
			switch m["type"] {
			case "response.completed", "response.incomplete", "response.failed", "error":
				return time.Since(t0), m
			}
		}
	}
	took, m := respond(480)
	if m["type"] == "error" || m["type"] == "response.failed" {
		t.Fatalf("long response: %v", m)
	}
	if took < pongWait+pongWait/4 {
		t.Skipf("the response took %v, not past the pong wait (%v): nothing to test on this machine", took, pongWait)
	}
	if _, m := respond(4); m["type"] == "error" || m["type"] == "response.failed" {
		t.Fatalf("the request after a long response: %v", m)
	}
	t.Logf("a %v response, then another on the same socket", took.Round(time.Millisecond))
}

// TestResponsesWebSocketWarmup: a response.create with generate: false
// (Codex's warm-up when it opens the socket) is answered with a completed
// response that has no output and generated nothing; the next request,
// chained on it with no input of its own, is answered over the warm-up's
// input, as the same request sent whole; another socket cannot chain on
// it.
func TestResponsesWebSocketWarmup(t *testing.T) {
	s := mustOpenAPI(t, nil)
	ws := dial(t, s.url+"/v1/responses", nil)
	read := func() (names []string, last map[string]any) {
		t.Helper()
		for {
			var m map[string]any
			if err := ws.ReadJSON(&m); err != nil {
				t.Fatal(err)
			}
			name, _ := m["type"].(string)
			names = append(names, name)
			switch name {
			case "response.completed", "response.incomplete", "response.failed", "error":
				return names, m
			}
		}
	}
	body := map[string]any{"type": "response.create", "instructions": "You tell stories.", "input": []map[string]any{{"role": "user", "content": "Once upon a time"}},
		"store": false, "max_output_tokens": 6, "temperature": 0}
	whole := func() map[string]any {
		t.Helper()
		if err := ws.WriteJSON(body); err != nil {
			t.Fatal(err)
		}
		_, m := read()
		return m["response"].(map[string]any)
	}
	want := whole()

	evaluated := s.engine.Stats().PromptEvaluated
	warm := map[string]any{"generate": false}
	for k, v := range body {
		warm[k] = v
	}
	if err := ws.WriteJSON(warm); err != nil {
		t.Fatal(err)
	}
	names, done := read()
	r := done["response"].(map[string]any)
	if fmt.Sprint(names) != "[response.created response.completed]" || r["status"] != "completed" || len(r["output"].([]any)) != 0 {
		t.Fatalf("warm-up answered %v: %+v", names, r)
	}
	if got := s.engine.Stats().PromptEvaluated; got != evaluated {
		t.Fatalf("the warm-up evaluated %d prompt tokens", got-evaluated)
	}
	next := map[string]any{"type": "response.create", "previous_response_id": r["id"], "input": []any{}, "store": false, "max_output_tokens": 6, "temperature": 0}
	if err := ws.WriteJSON(next); err != nil {
		t.Fatal(err)
	}
	_, m := read()
	got := m["response"].(map[string]any)
	text := func(r map[string]any) any { return r["output"].([]any)[0].(map[string]any)["content"] }
	if got["status"] != want["status"] || !reflect.DeepEqual(text(got), text(want)) || got["instructions"] != "You tell stories." {
		t.Fatalf("after the warm-up: %+v, want the output of the whole request %+v", m, want)
	}

	other := dial(t, s.url+"/v1/responses", nil)
	defer other.Close()
	if err := other.WriteJSON(next); err != nil {
		t.Fatal(err)
	}
	var e map[string]any
	if err := other.ReadJSON(&e); err != nil || e["type"] != "error" || e["status"] != float64(http.StatusNotFound) {
		t.Fatalf("another socket chained on the warm-up: %v %v", e, err)
	}
}

// A Responses WebSocket message may pass a POST body's cap (4 MiB) only by the room its images may take (the image
// limits): text past the cap beside an image, and a message past its cap with images, are each answered with a
// too_large error event while the socket serves on; one past twice its cap closes the socket with 1009. Its bytes past
// --max-message-bytes are held from the body budget: with no room there it is refused with busy and a retry time,
// and every byte is given back once its response has ended.
func TestResponsesSocketMessageCapWithImages(t *testing.T) {
	const bodyCap = 4 << 20 // apicore.MaxBodyBytes: a POST body's cap
	limits := media.Limits{MaxBytes: 3000, MaxImages: 2}
	capBytes := bodyCap + int(limits.MaxSourceBytes())
	open := func(mod func(*web.Config)) *stack {
		return openStack(t, stackOpts{maxTokens: 24, maxTokensCap: 480, tokenizer: true, cfg: mod, options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info), web.WithImages(media.Config{Limits: limits})}
		}})
	}
	s := open(nil)
	ws := dial(t, s.url+"/v1/responses", nil)
	// answer reads a request's events up to its last, which it returns.
	answer := func(ws *websocket.Conn) map[string]any {
		t.Helper()
		for {
			var m map[string]any
			ws.SetReadDeadline(time.Now().Add(hangWait))
			if err := ws.ReadJSON(&m); err != nil {
				t.Fatal(err)
			}
			switch m["type"] {
			case "response.completed", "response.incomplete", "response.failed", "error":
				return m
			}
		}
	}
	errorOf := func(m map[string]any) (code, message string) {
		e, _ := m["error"].(map[string]any)
		code, _ = e["code"].(string)
		message, _ = e["message"].(string)
		return code, message
	}
	tiny := pngURL(testimage.NoisePNG(t, 2, 2))
	withImage := func(text, url string) map[string]any {
		return map[string]any{"type": "response.create", "max_output_tokens": 4, "input": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": text}, map[string]any{"type": "input_image", "image_url": url}}}}}
	}
	for _, tc := range []struct {
		name string
		msg  map[string]any
		want string
	}{
		{"text past the cap beside an image", withImage(strings.Repeat("a", bodyCap), tiny), "without its images"},
		{"past the cap of a message with images", withImage("x", "data:image/png;base64,"+strings.Repeat("A", capBytes)), "the most one with images may be"},
	} {
		ws.WriteJSON(tc.msg)
		m := answer(ws)
		if code, message := errorOf(m); m["type"] != "error" || code != "too_large" || m["status"] != float64(http.StatusRequestEntityTooLarge) || !strings.Contains(message, tc.want) {
			t.Errorf("%s: %v", tc.name, m)
		}
	}
	ws.WriteJSON(map[string]any{"type": "response.create", "input": "Lily went to the park", "max_output_tokens": 4})
	if m := answer(ws); m["type"] == "error" || m["type"] == "response.failed" {
		t.Fatalf("after the refusals: %v", m)
	}
	// A request of more than --max-message-bytes holds the budget while it runs, and gives it back once it has ended.
	// (200 KiB of it is the JSON's white space.)
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "response.create", "input": "Lily went to the park",`+strings.Repeat(" ", 200<<10)+`"max_output_tokens": 4}`))
	if m := answer(ws); m["type"] == "error" || m["type"] == "response.failed" {
		t.Fatalf("a 200 KiB request: %v", m)
	}
	// The socket runs its requests in order: once the next is answered, the one before has given back its bytes.
	ws.WriteJSON(map[string]any{"type": "response.create", "input": "Lily", "max_output_tokens": 2})
	answer(ws)
	m := scrape(t, s.base)
	if got := m.value(t, "parley_body_bytes_inflight"); got != 0 {
		t.Errorf("after the responses: %v body bytes in flight, want 0", got)
	}
	if got := refusals(m, "message_too_large"); got != 2 {
		t.Errorf("message_too_large refusals = %v, want 2", got)
	}
	ws.WriteJSON(withImage("x", "data:image/png;base64,"+strings.Repeat("A", 2*capBytes)))
	if code := closeCode(t, ws); code != websocket.CloseMessageTooBig {
		t.Errorf("past twice the cap: close code %d, want 1009", code)
	}

	// With no room in the body budget, a message past --max-message-bytes is refused as the budget refuses an HTTP
	// body, and the socket serves on.
	small := open(func(c *web.Config) { c.MaxBodyBytesInflight = 4 << 10 })
	ws = dial(t, small.url+"/v1/responses", nil)
	ws.WriteJSON(withImage("x", "data:image/png;base64,"+strings.Repeat("A", 70<<10)))
	if m := answer(ws); m["type"] != "error" || m["status"] != float64(http.StatusServiceUnavailable) || m["retry_after"] == nil {
		t.Errorf("over the body budget: %v", m)
	} else if code, _ := errorOf(m); code != "busy" {
		t.Errorf("over the body budget: %v", m)
	}
	ws.WriteJSON(map[string]any{"type": "response.create", "input": "Lily went to the park", "max_output_tokens": 4})
	if m := answer(ws); m["type"] == "error" || m["type"] == "response.failed" {
		t.Errorf("after the budget's refusal: %v", m)
	}
	if got := scrape(t, small.base).value(t, "parley_body_bytes_inflight"); got != 0 {
		t.Errorf("after the budget's refusal: %v body bytes in flight, want 0", got)
	}
}
