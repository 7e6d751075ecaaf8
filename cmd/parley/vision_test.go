package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testimage"
	"github.com/parley-chat/parley/internal/testmodel"
)

// visionLibDir is the current engine's library folder the binary loads, or a skip when it has no libmtmd
// (make setup-vision builds it).
func visionLibDir(t *testing.T, bin string) string {
	t.Helper()
	dir := os.Getenv("PARLEY_ENGINE_LIB")
	if dir == "" {
		dir = filepath.Join(filepath.Dir(filepath.Dir(bin)), "lib", "llama-current")
	}
	if _, err := os.Stat(filepath.Join(dir, "libmtmd.so")); err != nil {
		if os.Getenv("PARLEY_REQUIRE_VISION") != "" {
			t.Fatalf("no libmtmd.so in %s (make setup-vision; the suite requires it)", dir)
		}
		t.Skipf("no libmtmd.so in %s (make setup-vision)", dir)
	}
	return dir
}

// visionProjector writes the synthetic projector that fits the test model (synth.DefaultProjector).
func visionProjector(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mmproj-test.gguf")
	if err := synth.WriteProjector(context.Background(), path, synth.DefaultProjector()); err != nil {
		t.Fatal(err)
	}
	return path
}

// testPNG is a w x h PNG whose pixels depend on seed.
func testPNG(t *testing.T, w, h int, seed byte) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, color.NRGBA{byte(x*7) + seed, byte(y*13) ^ seed, byte(x*y) + 3*seed, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func dataURL(b []byte) string { return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b) }

// postJSON posts body to the server's path and returns the status and the decoded answer.
func postJSON(t *testing.T, s *server, path string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post("http://"+s.addr+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

func getJSON(t *testing.T, s *server, path string) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + s.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// openAIImageChat is a chat request of one user message: an image, then text.
func openAIImageChat(url, text string) map[string]any {
	return map[string]any{"model": "x", "max_tokens": 8, "temperature": 0, "messages": []any{
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
			map[string]any{"type": "text", "text": text},
		}},
	}}
}

// readDone reads a JSON-mode socket until a reply's done message.
func readDone(t *testing.T, ws *websocket.Conn) jsonmode.Message {
	t.Helper()
	for {
		switch m := read(t, ws); m.Type {
		case "token":
		case "done":
			return m
		default:
			t.Fatalf("during a reply: %+v", m)
		}
	}
}

func errorMessage(out map[string]any) string {
	if e, ok := out["error"].(map[string]any); ok {
		m, _ := e["message"].(string)
		return m
	}
	if e, ok := out["error"].(string); ok {
		return e
	}
	return fmt.Sprint(out)
}

// A vision model (the test model with the synthetic projector, --mmproj) on the real binary: it says it sees
// images, takes a PNG on every HTTP API, reuses an image's KV on the next turn, and refuses each hostile image
// with a 400 naming its part, serving on after each.
func TestVisionBinary(t *testing.T) {
	bin := testbin.Parley(t)
	visionLibDir(t, bin)
	proj := visionProjector(t)
	s := start(t, bin, "--store", "memory", "--engine", "current", "--mmproj", proj, "--parallel", "1", "--cache-slots", "1")
	pngA, pngB := testPNG(t, 40, 32, 1), testPNG(t, 40, 32, 90)

	t.Run("says it sees images", func(t *testing.T) {
		if info := getJSON(t, s, "/info"); info["vision"] != true {
			t.Errorf("/info vision = %v", info["vision"])
		}
		models := getJSON(t, s, "/v1/models")
		if b, _ := json.Marshal(models); !strings.Contains(string(b), `"capabilities":["vision"]`) {
			t.Errorf("/v1/models: %s", b)
		}
		_, show := postJSON(t, s, "/api/show", map[string]any{"model": "llama"})
		if b, _ := json.Marshal(show["capabilities"]); !strings.Contains(string(b), `"vision"`) {
			t.Errorf("/api/show capabilities: %s", b)
		}
	})

	t.Run("OpenAI image_url, warm on the next turn", func(t *testing.T) {
		status, out := postJSON(t, s, "/v1/chat/completions", openAIImageChat(dataURL(pngA), "Once upon a time"))
		if status != 200 {
			t.Fatalf("%d %v", status, out)
		}
		first := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
		usage := out["usage"].(map[string]any)
		prompt1 := usage["prompt_tokens"].(float64)
		if first == "" || prompt1 < 16 { // the synthetic projector makes 16 positions of an image
			t.Fatalf("reply %q, %v prompt tokens", first, prompt1)
		}
		// The next turn repeats the conversation, image included: its prompt is evaluated from the cache.
		req := openAIImageChat(dataURL(pngA), "Once upon a time")
		req["messages"] = append(req["messages"].([]any), map[string]any{"role": "assistant", "content": first},
			map[string]any{"role": "user", "content": "And then?"})
		status, out = postJSON(t, s, "/v1/chat/completions", req)
		if status != 200 {
			t.Fatalf("second turn: %d %v", status, out)
		}
		usage = out["usage"].(map[string]any)
		details, _ := usage["prompt_tokens_details"].(map[string]any)
		cached, _ := details["cached_tokens"].(float64)
		prompt2 := usage["prompt_tokens"].(float64)
		if evaluated := prompt2 - cached; cached < 16 || evaluated >= prompt1 {
			t.Errorf("second turn: %v prompt tokens, %v cached (first turn %v): want the image's KV reused", prompt2, cached, prompt1)
		}
		t.Logf("first turn %v prompt tokens; second %v, %v of them cached", prompt1, prompt2, cached)
		// Another image gives another reply: the image reaches the model.
		status, out = postJSON(t, s, "/v1/chat/completions", openAIImageChat(dataURL(pngB), "Once upon a time"))
		if status != 200 {
			t.Fatalf("%d %v", status, out)
		}
		if other := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string); other == first {
			t.Errorf("two images gave the same reply %q", first)
		}
		// /metrics counted it: pngA encoded, found in the KV cache on the second turn and its pixels kept; pngB
		// encoded.
		for sample, want := range map[string]float64{
			"parley_image_encodes_total": 2, "parley_images_reused_total": 1,
			"parley_image_decodes_total": 2, "parley_image_decodes_kept_total": 1,
		} {
			if got := metric(t, s.addr, sample); got != want {
				t.Errorf("%s = %v, want %v", sample, got, want)
			}
		}
		if secs := metric(t, s.addr, "parley_image_encode_seconds_total"); secs <= 0 {
			t.Errorf("parley_image_encode_seconds_total = %v", secs)
		}
	})

	b64 := base64.StdEncoding.EncodeToString(pngA)
	t.Run("Anthropic image block", func(t *testing.T) {
		status, out := postJSON(t, s, "/v1/messages", map[string]any{"model": "x", "max_tokens": 8, "messages": []any{
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": b64}},
				map[string]any{"type": "text", "text": "Once upon a time"},
			}}}})
		if status != 200 || out["type"] != "message" {
			t.Fatalf("%d %v", status, out)
		}
	})
	t.Run("Ollama images", func(t *testing.T) {
		status, out := postJSON(t, s, "/api/chat", map[string]any{"model": "llama", "stream": false, "options": map[string]any{"num_predict": 8},
			"messages": []any{map[string]any{"role": "user", "content": "Once upon a time", "images": []string{b64}}}})
		if status != 200 || out["done"] != true {
			t.Fatalf("chat: %d %v", status, out)
		}
		status, out = postJSON(t, s, "/api/generate", map[string]any{"model": "llama", "stream": false, "options": map[string]any{"num_predict": 8},
			"prompt": "Once upon a time", "images": []string{b64}})
		if status != 200 || out["done"] != true {
			t.Fatalf("generate: %d %v", status, out)
		}
	})
	t.Run("Responses input_image", func(t *testing.T) {
		status, out := postJSON(t, s, "/v1/responses", map[string]any{"model": "x", "max_output_tokens": 8, "input": []any{
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "input_image", "image_url": dataURL(pngA)},
				map[string]any{"type": "input_text", "text": "Once upon a time"},
			}}}})
		if status != 200 || out["status"] == "failed" || len(out["output"].([]any)) == 0 {
			t.Fatalf("%d %v", status, out)
		}
	})

	t.Run("WebSocket JSON prompt with an image, resumed with it", func(t *testing.T) {
		ws := s.dial(t, "")
		id := read(t, ws).SessionID()
		ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "images": []string{dataURL(pngA)},
			"params": map[string]any{"max_tokens": 8}})
		first := readDone(t, ws)
		second := turn(t, ws, "And then?", map[string]any{"max_tokens": 8})
		if first.Usage.PromptTokens < 16 || second.Usage.CachedPromptTokens < first.Usage.PromptTokens ||
			second.Usage.PromptTokens-second.Usage.CachedPromptTokens >= first.Usage.PromptTokens {
			t.Errorf("first turn %+v, second %+v: want the second to reuse the first's prompt, image included", first.Usage, second.Usage)
		}
		// Content parts keep an image where it stands among the text, and the stored conversation says where.
		ws.WriteJSON(map[string]any{"type": "prompt", "params": map[string]any{"max_tokens": 4}, "content": []any{
			map[string]any{"type": "text", "text": "Once upon"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(pngB)}},
			map[string]any{"type": "text", "text": " a time"},
		}})
		readDone(t, ws)
		// A hostile image on the socket: an error naming it, and the connection serves on.
		ws.WriteJSON(map[string]any{"type": "prompt", "content": "x", "images": []string{dataURL(pngA[:40])}})
		if m := read(t, ws); m.Type != "error" || m.Field != "images[0]" {
			t.Errorf("a truncated image: %+v", m)
		}
		ws.Close()
		ws = s.dial(t, "&session="+id)
		sess := read(t, ws)
		want := sha256.Sum256(pngA)
		if len(sess.Messages) < 1 || len(sess.Messages[0].Images) != 1 || sess.Messages[0].Images[0].SHA256 != hex.EncodeToString(want[:]) ||
			!bytes.Equal(sess.Messages[0].Images[0].Data, pngA) {
			t.Errorf("resumed session: %+v", sess.Messages)
		}
		if len(sess.Messages) < 5 || sess.Messages[4].Content != "Once upon a time" || len(sess.Messages[4].Images) != 1 ||
			sess.Messages[4].Images[0].Offset != len("Once upon") {
			t.Errorf("resumed session: the parts prompt is %+v", sess.Messages[min(4, len(sess.Messages)-1)])
		}
	})

	// Hostile images: each a 400 that names the part, and the server serves on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	bomb := append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"), 0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0, 8, 2, 0, 0, 0, 0, 0, 0, 0)
	huge := append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"), 0, 0, 0x50, 0, 0, 0, 0, 1, 8, 2, 0, 0, 0, 0, 0, 0, 0)
	for _, tc := range []struct{ name, url, want string }{
		{"decompression bomb", dataURL(bomb), "too large"},
		{"huge side", dataURL(huge), "too large"},
		{"truncated", dataURL(pngA[:len(pngA)/2]), "does not decode"},
		{"wrong magic", dataURL([]byte("GIF00000 this is not an image at all")), "format"},
		{"unsupported format", dataURL(append([]byte("BM"), make([]byte, 60)...)), "BMP"},
		{"not base64", "data:image/png;base64,!!!!", "encoding"},
		{"remote URL off", "http://example.com/cat.png", "remote image URLs are off"},
		{"SSRF to loopback", "http://" + ln.Addr().String() + "/x.png", "remote image URLs are off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := postJSON(t, s, "/v1/chat/completions", openAIImageChat(tc.url, "Hi"))
			msg := errorMessage(out)
			if status != 400 || !strings.Contains(msg, "messages[0].content[0]") || !strings.Contains(msg, tc.want) {
				t.Errorf("%d %q; want 400 naming messages[0].content[0] and %q", status, msg, tc.want)
			}
		})
	}
	// The other APIs name their own parts.
	truncated := base64.StdEncoding.EncodeToString(pngA[:len(pngA)/2])
	bomb64 := base64.StdEncoding.EncodeToString(bomb)
	for _, tc := range []struct {
		name, path, part string
		body             map[string]any
	}{
		{"Anthropic bomb", "/v1/messages", "messages[0].content[0]", map[string]any{"model": "x", "max_tokens": 4, "messages": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": bomb64}}}}}}},
		{"Ollama truncated", "/api/chat", "messages[0].images[0]", map[string]any{"model": "llama", "stream": false,
			"messages": []any{map[string]any{"role": "user", "content": "x", "images": []string{truncated}}}}},
		{"Ollama generate wrong magic", "/api/generate", "images[0]", map[string]any{"model": "llama", "stream": false,
			"prompt": "x", "images": []string{base64.StdEncoding.EncodeToString([]byte("hello, not an image"))}}},
		{"Responses SSRF", "/v1/responses", "input[0].content[0]", map[string]any{"model": "x", "input": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_image", "image_url": "http://169.254.169.254/latest/meta-data"}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := postJSON(t, s, tc.path, tc.body)
			if msg := errorMessage(out); status != 400 || !strings.Contains(msg, tc.part) {
				t.Errorf("%d %q; want a 400 naming %s", status, msg, tc.part)
			}
		})
	}
	if status, out := postJSON(t, s, "/v1/chat/completions", openAIImageChat(dataURL(pngA), "Once upon a time")); status != 200 {
		t.Fatalf("after the hostile images: %d %v", status, out)
	}
	// Each refusal counted once under its reason: the socket's truncated image and the two truncated ones above
	// pass the header check and fail in the decoder.
	for reason, want := range map[string]float64{
		"too_large": 3, "decode": 3, "format": 3, "encoding": 1, "remote_off": 3, "no_vision": 0, "other": 0,
	} {
		sample := `parley_image_refusals_total{reason="` + reason + `"}`
		if got := metric(t, s.addr, sample); got != want {
			t.Errorf("%s = %v, want %v", sample, got, want)
		}
	}
}

// A model without a projector refuses an image part with a 400 that names it and says why.
func TestVisionRefusedWithoutProjector(t *testing.T) {
	bin := testbin.Parley(t)
	_ = testmodel.Path(t)
	s := start(t, bin, "--store", "memory")
	status, out := postJSON(t, s, "/v1/chat/completions", openAIImageChat(dataURL(testPNG(t, 8, 8, 1)), "Hi"))
	if msg := errorMessage(out); status != 400 || !strings.Contains(msg, "messages[0].content[0]") || !strings.Contains(msg, "does not see images") {
		t.Errorf("%d %q", status, msg)
	}
	if info := getJSON(t, s, "/info"); info["vision"] != false {
		t.Errorf("/info vision = %v", info["vision"])
	}
	if n := metric(t, s.addr, `parley_image_refusals_total{reason="no_vision"}`); n != 1 {
		t.Errorf("no_vision refusals = %v, want 1", n)
	}
}

// With remote image URLs allowed for a host, a name that resolves to loopback and a loopback address are still
// refused (checked after DNS resolution, on the connection), each a 400 naming the part; the server never fetches.
func TestVisionRemoteURLsNeverReachLoopback(t *testing.T) {
	bin := testbin.Parley(t)
	fetched := make(chan struct{}, 4)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetched <- struct{}{}
		w.Header().Set("Content-Type", "image/png")
		w.Write(testPNG(t, 8, 8, 1))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	defer hs.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	s := start(t, bin, "--store", "memory", "--image-url-allow", "localhost:"+port+",127.0.0.1:"+port)
	for _, url := range []string{"http://localhost:" + port + "/cat.png", "http://127.0.0.1:" + port + "/cat.png"} {
		status, out := postJSON(t, s, "/v1/chat/completions", openAIImageChat(url, "Hi"))
		if msg := errorMessage(out); status != 400 || !strings.Contains(msg, "messages[0].content[0]") || !strings.Contains(msg, "loopback") {
			t.Errorf("%s: %d %q; want a 400 naming the part and the loopback address", url, status, msg)
		}
	}
	select {
	case <-fetched:
		t.Error("the server fetched from a loopback address")
	default:
	}
}

// A socket message that carries images may be as large as the image limits allow, past --max-message-bytes: a
// pasted ~200 KiB PNG is taken. One over that cap, or whose text alone is over --max-message-bytes, is answered
// with an error that says so, and the connection and its conversation go on.
func TestVisionSocketMessageSize(t *testing.T) {
	bin := testbin.Parley(t)
	visionLibDir(t, bin)
	s := start(t, bin, "--store", "memory", "--engine", "current", "--mmproj", visionProjector(t),
		"--image-max-bytes", "300000", "--image-max-per-request", "1")
	big := testimage.NoisePNG(t, 300, 240)
	if len(big) < 200<<10 || len(big) > 300000 {
		t.Fatalf("the test image is %d bytes", len(big))
	}
	ws := s.dial(t, "")
	id := read(t, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "images": []string{dataURL(big)},
		"params": map[string]any{"max_tokens": 4}})
	first := readDone(t, ws)
	if first.Usage.PromptTokens < 16 {
		t.Fatalf("the reply to a %d-byte image: %+v", len(big), first.Usage)
	}
	tooBig := strings.Repeat("A", 500_000) // over 64 KiB and the one image's 400 KB of base64
	for _, tc := range []struct {
		name string
		msg  map[string]any
		want string
	}{
		{"over the cap of a message with images", map[string]any{"type": "prompt", "content": "x", "images": []string{"data:image/png;base64," + tooBig}}, "bytes"},
		{"text over the cap beside a small image", map[string]any{"type": "prompt", "content": strings.Repeat("a", 70<<10), "images": []string{dataURL(testPNG(t, 8, 8, 1))}}, "without its images"},
	} {
		ws.WriteJSON(tc.msg)
		if m := read(t, ws); m.Type != "error" || m.Code != "too_large" || !strings.Contains(m.Message, tc.want) {
			t.Errorf("%s: %+v", tc.name, m)
		}
	}
	// The connection serves on, and the conversation holds its first turn.
	second := turn(t, ws, "And then?", map[string]any{"max_tokens": 4})
	if second.Usage.PromptTokens <= first.Usage.PromptTokens {
		t.Errorf("the next turn: %+v; the first %+v", second.Usage, first.Usage)
	}
	if n := metric(t, s.addr, `parley_refusals_total{cause="message_too_large"}`); n != 2 {
		t.Errorf("message_too_large refusals = %v, want 2", n)
	}
	ws.Close()
	ws = s.dial(t, "&session="+id)
	if sess := read(t, ws); len(sess.Messages) != 4 || len(sess.Messages[0].Images) != 1 || !bytes.Equal(sess.Messages[0].Images[0].Data, big) {
		t.Errorf("resumed: %d messages", len(sess.Messages))
	}
}

// The Responses API's WebSocket mode takes images as large as the image limits allow, past a POST body's 4 MiB: a
// ~200 KiB PNG and one of more than 4 MiB, each a response.create of one stored conversation. One over the cap of a
// message with images, or whose text alone is over 4 MiB, is answered with a too_large error event, and the socket
// and its conversation go on. Once the responses have ended, no byte of the body budget is held.
func TestVisionResponsesSocketMessageSize(t *testing.T) {
	bin := testbin.Parley(t)
	visionLibDir(t, bin)
	s := start(t, bin, "--store", "memory", "--engine", "current", "--mmproj", visionProjector(t),
		"--image-max-bytes", "6000000", "--image-max-per-request", "1")
	small, big := testimage.NoisePNG(t, 300, 240), testimage.NoisePNG(t, 1300, 1100)
	if len(small) < 200<<10 || len(small) > 300<<10 || len(big) < 4<<20 || len(big) > 6000000 {
		t.Fatalf("the test images are %d and %d bytes", len(small), len(big))
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+s.addr+"/v1/responses", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	// respond sends a request and returns its last event.
	respond := func(req map[string]any) map[string]any {
		t.Helper()
		req["type"], req["max_output_tokens"] = "response.create", 4
		if err := ws.WriteJSON(req); err != nil {
			t.Fatal(err)
		}
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
	withImage := func(url, text string) []any {
		return []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_image", "image_url": url}, map[string]any{"type": "input_text", "text": text}}}}
	}
	// completed returns a completed response's id and input tokens.
	completed := func(what string, m map[string]any) (string, float64) {
		t.Helper()
		r, _ := m["response"].(map[string]any)
		if m["type"] != "response.completed" && m["type"] != "response.incomplete" || r == nil {
			t.Fatalf("%s: %v", what, m)
		}
		usage, _ := r["usage"].(map[string]any)
		in, _ := usage["input_tokens"].(float64)
		return r["id"].(string), in
	}
	id1, in1 := completed("a ~200 KiB image", respond(map[string]any{"input": withImage(dataURL(small), "Once upon a time")}))
	if in1 < 16 { // the synthetic projector makes 16 positions of an image
		t.Fatalf("the response to a %d-byte image evaluated %v input tokens", len(small), in1)
	}
	// The conversation keeps the 4 MiB image with its first turn: its images have a budget of their own, apart from
	// its 1 MiB of text.
	id2, in2 := completed("a 4 MiB image", respond(map[string]any{"previous_response_id": id1, "input": withImage(dataURL(big), "Once upon a time")}))
	if in2 <= in1+16 {
		t.Fatalf("the response to a %d-byte image evaluated %v input tokens; the one before %v", len(big), in2, in1)
	}
	for _, tc := range []struct {
		name string
		req  map[string]any
		want string
	}{
		{"over the cap of a message with images", map[string]any{"previous_response_id": id1, "input": withImage("data:image/png;base64,"+strings.Repeat("A", 13_000_000), "x")}, "the most one with images may be"},
		{"text over the cap beside a small image", map[string]any{"previous_response_id": id1, "input": withImage(dataURL(testPNG(t, 8, 8, 1)), strings.Repeat("a", 4<<20))}, "without its images"},
	} {
		m := respond(tc.req)
		e, _ := m["error"].(map[string]any)
		if msg, _ := e["message"].(string); m["type"] != "error" || e["code"] != "too_large" || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %v", tc.name, m)
		}
	}
	// The socket serves on, and the conversation holds its images.
	if _, in3 := completed("the next turn", respond(map[string]any{"previous_response_id": id2, "input": "And then?"})); in3 <= in2 {
		t.Errorf("the next turn evaluated %v input tokens; the one before %v", in3, in2)
	}
	// The socket runs its requests in order: each has given back its bytes before the next is read.
	if n := metric(t, s.addr, "parley_body_bytes_inflight"); n != 0 {
		t.Errorf("%v body bytes in flight after the responses, want 0", n)
	}
	if n := metric(t, s.addr, `parley_refusals_total{cause="message_too_large"}`); n != 2 {
		t.Errorf("message_too_large refusals = %v, want 2", n)
	}
}
