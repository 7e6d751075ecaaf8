package web_test

import (
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/media"
	"github.com/parley-chat/parley/web"
)

// A JSON-mode message may pass the message cap only by the room its images may take (the image limits): text past
// the cap, a message past its cap with images, and a message the body budget has no room for are each answered
// with an error while the connection serves on; a message past twice its cap closes the connection with 1009. A
// text-mode message keeps its cap.
func TestSocketMessageCapWithImages(t *testing.T) {
	limits := media.Limits{MaxBytes: 3000, MaxImages: 2}
	capBytes := int(web.DefaultMaxMessageBytes + limits.MaxSourceBytes())
	images := func(s *stack) []web.Option { return []web.Option{web.WithImages(media.Config{Limits: limits})} }
	h := openStack(t, stackOpts{options: images})
	ws := dial(t, h.url+"/ws?format=json", nil)
	if m := readJSON(t, ws); m.Type != "session" {
		t.Fatalf("first message: %+v", m)
	}
	tiny := "data:image/png;base64," + strings.Repeat("A", 100)
	for _, tc := range []struct {
		name string
		msg  map[string]any
		want string
	}{
		{"text past the cap", map[string]any{"type": "prompt", "content": strings.Repeat("a ", 34<<10)}, "without its images"},
		{"text past the cap beside an image", map[string]any{"type": "prompt", "content": strings.Repeat("a ", 34<<10), "images": []string{tiny}}, "without its images"},
		{"past the cap of a message with images", map[string]any{"type": "prompt", "content": "x", "images": []string{"data:image/png;base64," + strings.Repeat("A", capBytes)}}, "the most one with images may be"},
	} {
		ws.WriteJSON(tc.msg)
		if m := readJSON(t, ws); m.Type != "error" || m.Code != "too_large" || !strings.Contains(m.Message, tc.want) {
			t.Errorf("%s: %+v", tc.name, m)
		}
	}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Lily went to the park", "params": map[string]any{"max_tokens": 4}})
	if _, done := readUntilDone(t, ws); done.Type != "done" {
		t.Errorf("after the refusals: %+v", done)
	}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "x", "images": []string{strings.Repeat("A", 2*capBytes+1)}})
	if code := closeCode(t, ws); code != websocket.CloseMessageTooBig {
		t.Errorf("past twice the cap: close code %d, want 1009", code)
	}
	text := dial(t, h.url+"/ws", nil)
	text.WriteMessage(websocket.TextMessage, []byte(strings.Repeat("a", int(web.DefaultMaxMessageBytes)+1)))
	if code := closeCode(t, text); code != websocket.CloseMessageTooBig {
		t.Errorf("text mode past the cap: close code %d, want 1009", code)
	}

	// With no room in the body budget, a message past the cap is refused as the budget refuses an HTTP body.
	small := openStack(t, stackOpts{options: images, cfg: func(c *web.Config) { c.MaxBodyBytesInflight = 4 << 10 }})
	ws = dial(t, small.url+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "x", "images": []string{"data:image/png;base64," + strings.Repeat("A", 70<<10)}})
	if m := readJSON(t, ws); m.Type != "error" || m.Code != "busy" || m.RetryAfter <= 0 {
		t.Errorf("over the body budget: %+v", m)
	}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Lily went to the park", "params": map[string]any{"max_tokens": 4}})
	if _, done := readUntilDone(t, ws); done.Type != "done" {
		t.Errorf("after the budget's refusal: %+v", done)
	}
}
