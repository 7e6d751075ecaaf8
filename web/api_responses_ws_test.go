package web_test

import (
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
