package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testimage"
)

// A stored conversation keeps an image larger than its 1 MiB of text with its earlier turns, on the chat socket and
// on the Responses API: images are held to a budget of their own (--image-max-bytes-per-conversation). A prompt whose
// new image would pass that budget is refused before it runs with a too_large error naming the flag, and the
// conversation is unchanged: it resumes with the same messages, and its last response still continues.
func TestVisionStoredConversationKeepsLargeImages(t *testing.T) {
	bin := testbin.Parley(t)
	visionLibDir(t, bin)
	s := start(t, bin, "--store", "memory", "--engine", "current", "--mmproj", visionProjector(t),
		"--image-max-bytes", "3000000", "--image-max-bytes-per-conversation", "2000000")
	big, other := testimage.NoisePNG(t, 700, 600), testimage.NoisePNG(t, 690, 600) // each over 1 MiB; together over 2,000,000 bytes
	if len(big) <= 1<<20 || len(other) <= 1<<20 || len(big)+len(other) <= 2000000 || len(big) > 2000000 {
		t.Fatalf("the test images are %d and %d bytes", len(big), len(other))
	}

	t.Run("chat socket", func(t *testing.T) {
		ws := s.dial(t, "")
		id := read(t, ws).SessionID()
		turn(t, ws, "Once upon a time", map[string]any{"max_tokens": 4})
		ws.WriteJSON(map[string]any{"type": "prompt", "content": "Look", "images": []string{dataURL(big)}, "params": map[string]any{"max_tokens": 4}})
		if done := readDone(t, ws); done.Usage.PromptTokens < 16 {
			t.Fatalf("the image turn: %+v", done.Usage)
		}
		// A second large image would take the conversation's images past 2,000,000 bytes: refused, nothing run.
		ws.WriteJSON(map[string]any{"type": "prompt", "content": "And this", "images": []string{dataURL(other)}, "params": map[string]any{"max_tokens": 4}})
		if m := read(t, ws); m.Type != "error" || m.Code != "too_large" || !strings.Contains(m.Message, "--image-max-bytes-per-conversation") {
			t.Fatalf("an image past the conversation's budget: %+v", m)
		}
		// The same image again costs nothing more.
		ws.WriteJSON(map[string]any{"type": "prompt", "content": "Again", "images": []string{dataURL(big)}, "params": map[string]any{"max_tokens": 4}})
		readDone(t, ws)
		ws.Close()
		ws = s.dial(t, "&session="+id)
		sess := read(t, ws)
		// The image's bytes come once, on the first message that holds it; the third names it by its hash.
		if len(sess.Messages) != 6 || sess.Messages[0].Content != "Once upon a time" || len(sess.Messages[2].Images) != 1 ||
			!bytes.Equal(sess.Messages[2].Images[0].Data, big) || len(sess.Messages[4].Images) != 1 ||
			sess.Messages[4].Images[0].SHA256 != sess.Messages[2].Images[0].SHA256 {
			t.Fatalf("resumed: %d messages, want the three turns with the image on the second and third", len(sess.Messages))
		}
	})

	t.Run("Responses", func(t *testing.T) {
		withImage := func(b []byte) []any {
			return []any{map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "input_image", "image_url": dataURL(b)}, map[string]any{"type": "input_text", "text": "Look"}}}}
		}
		respond := func(req map[string]any) (int, map[string]any) {
			t.Helper()
			req["model"], req["max_output_tokens"] = "x", 4
			return postJSON(t, s, "/v1/responses", req)
		}
		// ok runs a request that must succeed and returns its response.
		ok := func(what string, req map[string]any) map[string]any {
			t.Helper()
			status, out := respond(req)
			if status != 200 || out["status"] == "failed" {
				t.Fatalf("%s: %d %v", what, status, out)
			}
			return out
		}
		first := ok("the first turn", map[string]any{"input": "Once upon a time"})["id"].(string)
		second := ok("the image turn", map[string]any{"previous_response_id": first, "input": withImage(big)})["id"].(string)
		for _, id := range []string{first, second} {
			if out := getJSON(t, s, "/v1/responses/"+id); out["id"] != id {
				t.Fatalf("response %s after the image turn: %v", id, out)
			}
		}
		status, out := respond(map[string]any{"previous_response_id": second, "input": withImage(other)})
		if msg := errorMessage(out); status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "--image-max-bytes-per-conversation") {
			t.Fatalf("an image past the conversation's budget: %d %q", status, msg)
		}
		// The conversation is unchanged: its last response is still its newest turn, and continues with the whole
		// history, the image included.
		prev := ok("the next turn", map[string]any{"previous_response_id": second, "input": "And then?"})
		for _, id := range []string{first, second} {
			if out := getJSON(t, s, "/v1/responses/"+id); out["id"] != id {
				t.Fatalf("response %s after the refusal: %v", id, out)
			}
		}
		in := func(out map[string]any) float64 {
			usage, _ := out["usage"].(map[string]any)
			n, _ := usage["input_tokens"].(float64)
			return n
		}
		if img := getJSON(t, s, "/v1/responses/"+second); in(prev) <= in(img) || in(img) < 16 {
			t.Errorf("the next turn evaluated %v input tokens, the image turn %v: want the history with its image", in(prev), in(img))
		}
	})
}
