package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

func TestTextModeStreamsThenSentinel(t *testing.T) {
	s := openStack(t, stackOpts{})
	for _, path := range []string{"/", "/ws"} {
		ws := dial(t, s.url+path, nil)
		ws.WriteMessage(websocket.TextMessage, []byte("Space the final"))
		pieces := readReply(t, ws)
		if len(pieces) < 2 {
			t.Fatalf("%s: want a streamed reply in several pieces, got %q", path, pieces)
		}
		if strings.TrimSpace(strings.Join(pieces, "")) == "" {
			t.Fatalf("%s: empty reply", path)
		}
	}
}

func TestSecondTurnCarriesTheFirst(t *testing.T) {
	s := openStack(t, stackOpts{})
	ws := dial(t, s.url, nil)
	ws.WriteMessage(websocket.TextMessage, []byte("Lily found a red ball"))
	first := strings.Join(readReply(t, ws), "")
	ws.WriteMessage(websocket.TextMessage, []byte("What did Lily do next?"))
	readReply(t, ws)
	prompts := s.sessions.Prompts()
	if len(prompts) != 2 {
		t.Fatalf("want 2 turns, got %d", len(prompts))
	}
	second := prompts[1]
	if !strings.Contains(second, "Lily found a red ball") || !strings.Contains(second, strings.TrimSpace(first)) ||
		!strings.Contains(second, "What did Lily do next?") {
		t.Fatalf("second prompt does not carry the first turn:\n%s\n--- first reply: %q", second, first)
	}
}

func TestQueuedPromptsDoNotInterleave(t *testing.T) {
	s := openStack(t, stackOpts{})
	ws := dial(t, s.url, nil)
	ws.WriteMessage(websocket.TextMessage, []byte("Tom had a dog"))
	ws.WriteMessage(websocket.TextMessage, []byte("The dog was big"))
	a := readReply(t, ws)
	b := readReply(t, ws)
	if len(a) == 0 || len(b) == 0 {
		t.Fatalf("empty replies %q %q", a, b)
	}
	prompts := s.sessions.Prompts()
	if len(prompts) != 2 || !strings.Contains(prompts[1], "Tom had a dog") || !strings.Contains(prompts[1], strings.TrimSpace(strings.Join(a, ""))) {
		t.Fatalf("second prompt should follow the whole first reply: %q", prompts)
	}
}

func TestJSONModeTokensDoneCancelReset(t *testing.T) {
	s := openStack(t, stackOpts{})
	ws := dial(t, s.url+"/ws?format=json", nil)
	open := readJSON(t, ws)
	id := open.SessionID()
	if open.Type != "session" || !session.ValidID(id) || open.Resumed {
		t.Fatalf("first message %+v", open)
	}

	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 12}})
	toks, done := readUntilDone(t, ws)
	if done.Type != "done" || done.Usage.CompletionTokens != len(toks) || len(toks) == 0 || len(toks) > 12 {
		t.Fatalf("done %+v after %d tokens", done, len(toks))
	}
	for _, tk := range toks {
		if tk.Logprob > 0 || tk.Logprob < -50 {
			t.Fatalf("implausible logprob %v", tk.Logprob)
		}
	}
	var text string
	for _, tk := range toks {
		text += tk.Text
	}
	if !strings.HasPrefix(text, strings.TrimRight(done.Content, " ")) && text != done.Content {
		t.Fatalf("token texts %q do not make the content %q", text, done.Content)
	}

	// Second turn reuses the first turn's KV cache.
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "And then?", "params": map[string]any{"max_tokens": 4}})
	_, done2 := readUntilDone(t, ws)
	if done2.Usage.CachedPromptTokens == 0 {
		t.Fatalf("second turn reused nothing from the cache: %+v", done2.Usage)
	}

	// Cancel mid-reply.
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Tell a long story", "params": map[string]any{"max_tokens": 400}})
	first := readJSON(t, ws)
	if first.Type != "token" {
		t.Fatalf("want a token first, got %+v", first)
	}
	ws.WriteJSON(map[string]any{"type": "cancel"})
	_, done3 := readUntilDone(t, ws)
	if done3.FinishReason != "cancelled" {
		t.Fatalf("after cancel: %+v", done3)
	}

	// Reset clears the history.
	ws.WriteJSON(map[string]any{"type": "reset"})
	after := readJSON(t, ws)
	if after.Type != "session" || len(after.Messages) != 0 {
		t.Fatalf("after reset: %+v", after)
	}

	// Bad messages get errors naming the problem, and the connection lives on.
	for _, bad := range []string{`{`, `{"type":"dance"}`, `{"type":"prompt"}`, `{"type":"prompt","content":"x","params":{"temperature":-1}}`, `[]`} {
		ws.WriteMessage(websocket.TextMessage, []byte(bad))
		m := readJSON(t, ws)
		if m.Type != "error" || m.Code != "invalid" || m.Message == "" {
			t.Fatalf("%s: want an invalid error, got %+v", bad, m)
		}
	}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Lily", "params": map[string]any{"max_tokens": 3}})
	if _, d := readUntilDone(t, ws); d.Type != "done" {
		t.Fatalf("connection broken after bad messages: %+v", d)
	}
}

func TestResumeBySessionID(t *testing.T) {
	s := openStack(t, stackOpts{})
	ws := dial(t, s.url+"/ws?format=json", nil)
	open := readJSON(t, ws)
	id := open.SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "The cat sat", "params": map[string]any{"max_tokens": 5}})
	readUntilDone(t, ws)
	ws.Close()

	ws2 := dial(t, s.url+"/ws?format=json&session="+id, nil)
	again := readJSON(t, ws2)
	if again.Type != "session" || !again.Resumed || len(again.Messages) != 2 || again.Messages[0].Content != "The cat sat" {
		t.Fatalf("resume: %+v", again)
	}

	ws3 := dial(t, s.url+"/ws?format=json&session=AAAAAAAAAAAAAAAAAAAAAA", nil)
	if m := readJSON(t, ws3); m.Type != "error" || m.Code != "not_found" {
		t.Fatalf("unknown session: %+v", m)
	}
}

func TestProtocolHygiene(t *testing.T) {
	s := openStack(t, stackOpts{cfg: func(c *web.Config) { c.MaxMessageBytes = 1024 }})
	cases := []struct {
		name string
		mt   int
		data []byte
		code int
	}{
		{"invalid utf-8", websocket.TextMessage, []byte{0xff, 0xfe, 'a'}, websocket.CloseInvalidFramePayloadData},
		{"binary", websocket.BinaryMessage, []byte("hello"), websocket.CloseUnsupportedData},
		{"too big", websocket.TextMessage, []byte(strings.Repeat("a", 2048)), websocket.CloseMessageTooBig},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ws := dial(t, s.url, nil)
			ws.WriteMessage(c.mt, c.data)
			if got := closeCode(t, ws); got != c.code {
				t.Fatalf("close code %d, want %d", got, c.code)
			}
		})
	}
	// The server still answers.
	ws := dial(t, s.url, nil)
	ws.WriteMessage(websocket.TextMessage, []byte("Hello"))
	if len(readReply(t, ws)) == 0 {
		t.Fatal("no reply after hostile frames")
	}
}

func TestWhoMayConnect(t *testing.T) {
	s := openStack(t, stackOpts{cfg: func(c *web.Config) {
		c.APIKey = "s3cret"
		c.AllowedOrigins = []string{"https://chat.example"}
	}})
	bearer := http.Header{"Authorization": {"Bearer s3cret"}}
	cases := []struct {
		name string
		hdr  http.Header
		want int
	}{
		{"no key", nil, http.StatusUnauthorized},
		{"wrong key", http.Header{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
		{"bearer", bearer, http.StatusSwitchingProtocols},
		{"subprotocol key", http.Header{"Sec-WebSocket-Protocol": {"parley.v1+json, parley.key.s3cret"}}, http.StatusSwitchingProtocols},
		{"cross origin", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {"https://evil.example"}}, http.StatusForbidden},
		{"allowed origin", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {"https://chat.example"}}, http.StatusSwitchingProtocols},
		{"same origin", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {"http://" + s.srv.Addr()}}, http.StatusSwitchingProtocols},
		{"lower-case bearer", http.Header{"Authorization": {"bearer s3cret"}}, http.StatusSwitchingProtocols},
		{"upper-case bearer", http.Header{"Authorization": {"BEARER s3cret"}}, http.StatusSwitchingProtocols},
		{"bearer without a key", http.Header{"Authorization": {"bearer "}}, http.StatusUnauthorized},
		{"same host, other scheme", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {"https://" + s.srv.Addr()}}, http.StatusForbidden},
		{"same host, ftp scheme", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {"ftp://" + s.srv.Addr()}}, http.StatusForbidden},
		{"same host, no scheme", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {s.srv.Addr()}}, http.StatusForbidden},
		{"https behind a proxy", http.Header{"Authorization": {"Bearer s3cret"}, "Origin": {"https://" + s.srv.Addr()}, "X-Forwarded-Proto": {"https"}}, http.StatusSwitchingProtocols},
	}
	for _, c := range cases {
		if got := upgradeStatus(t, s.url+"/ws", c.hdr); got != c.want {
			t.Errorf("%s: status %d, want %d", c.name, got, c.want)
		}
	}
}

func TestShutdownClosesSocketsWithGoingAway(t *testing.T) {
	s := openStack(t, stackOpts{})
	ws := dial(t, s.url, nil)
	ws.WriteMessage(websocket.TextMessage, []byte("Hi"))
	readReply(t, ws)
	done := make(chan error, 1)
	go func() { done <- s.srv.Close(context.Background()) }()
	if got := closeCode(t, ws); got != websocket.CloseGoingAway {
		t.Fatalf("close code %d, want 1001", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
