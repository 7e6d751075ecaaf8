package web_test

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

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
