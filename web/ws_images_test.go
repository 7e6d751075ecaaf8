package web_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/testimage"
	"github.com/parley-chat/parley/llm"
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

func pngURL(b []byte) string { return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b) }

// refusals is parley_refusals_total{cause} in a scrape (0 before the first).
func refusals(m metrics, cause string) float64 {
	if s := m.find("parley_refusals_total", "cause", cause); s != nil {
		return s.GetCounter().GetValue()
	}
	return 0
}

// The images of prompts waiting in a connection's queue behind a running reply hold their bytes of the body budget
// until the worker takes each prompt: the budget's bytes in flight count them (exactly their bytes: what the message
// held while it was read beyond them is given back once it is taken in), a prompt whose images the budget has no room
// for is refused with busy and what to do while the connection goes on, and the bytes come back as the prompts are
// taken, or when the connection ends with prompts still waiting.
func TestSocketQueuedImagesHoldTheBodyBudget(t *testing.T) {
	img := testimage.NoisePNG(t, 110, 110) // about 36 KB: a message under --max-message-bytes, which holds nothing as it is read
	n := float64(len(img))
	// open starts a stack whose replies stop at their second token until the gate is closed.
	open := func() (*stack, chan struct{}) {
		gate := make(chan struct{})
		h := openStack(t, stackOpts{
			cfg: func(c *web.Config) { c.MaxBodyBytesInflight = int64(2.5 * n) }, // two prompts' images wait; a third's do not fit
			generator: func(e *llm.Engine) chat.Generator {
				return &pacedGenerator{Engine: e, gap: time.Millisecond, hold: 2, gate: gate}
			},
			options: func(s *stack) []web.Option { return []web.Option{web.WithImages(media.Config{})} },
		})
		return h, gate
	}
	h, gate := open()
	inflight := func(h *stack, what string, want float64) {
		t.Helper()
		eventually(t, fmt.Sprintf("%s: %v bytes in flight", what, want), func() bool {
			return scrape(t, h.base).value(t, "parley_body_bytes_inflight") == want
		})
	}
	// A reply runs, held at its second token; prompts with an image each wait behind it.
	ws, _, _ := startReply(t, h, "Once upon a time", 32, 2)
	prompt := map[string]any{"type": "prompt", "content": "Look", "images": []string{pngURL(img)}}
	ws.WriteJSON(prompt)
	inflight(h, "one prompt's image waits", n)
	ws.WriteJSON(prompt)
	inflight(h, "two prompts' images wait", 2*n)
	ws.WriteJSON(prompt)
	eventually(t, "the third prompt refused by the budget", func() bool { return refusals(scrape(t, h.base), "body_budget") == 1 })
	if got := scrape(t, h.base).value(t, "parley_body_bytes_inflight"); got != 2*n {
		t.Fatalf("after the refusal: %v bytes in flight, want %v", got, 2*n)
	}

	// The reply ends; each waiting prompt is taken (this model does not see images: its turn refuses them), then
	// the third prompt's refusal, in the order of the messages.
	close(gate)
	if _, done := readUntilDone(t, ws); done.Type != "done" {
		t.Fatalf("the running reply: %+v", done)
	}
	for i := range 2 {
		if m := readJSON(t, ws); m.Type != "error" || !strings.Contains(m.Message, "does not see images") {
			t.Fatalf("waiting prompt %d: %+v", i, m)
		}
	}
	if m := readJSON(t, ws); m.Type != "error" || m.Code != "busy" || m.RetryAfter <= 0 || !strings.Contains(m.Message, "images of prompts waiting") {
		t.Fatalf("the refused prompt: %+v", m)
	}
	inflight(h, "every prompt taken", 0)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Lily went to the park", "params": map[string]any{"max_tokens": 4}})
	if _, done := readUntilDone(t, ws); done.Type != "done" {
		t.Errorf("after the refusal: %+v", done)
	}

	// A connection that ends with prompts waiting gives their bytes back.
	h, gate = open()
	defer close(gate)
	ws, _, _ = startReply(t, h, "Once upon a time", 32, 2)
	ws.WriteJSON(prompt)
	ws.WriteJSON(prompt)
	inflight(h, "two prompts' images wait", 2*n)
	ws.Close()
	inflight(h, "the connection ended", 0)
}
