package web_test

import (
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/web"
)

// TestContinueCarriesOnAReplyAtItsLength: a greedy reply stopped at its
// length and then continued (the continue message) is the reply that one
// turn of both lengths writes, word for word (with the repetition penalty
// off: its window holds the tokens the reply generated, and a continuation
// has the first part in its prompt instead); the done message carries the
// whole reply, the stored session holds it once, in one turn. A session
// with no reply refuses to continue, and stays usable.
func TestContinueCarriesOnAReplyAtItsLength(t *testing.T) {
	s := openStack(t, stackOpts{})
	long := dial(t, s.url+"/ws?format=json", nil)
	readJSON(t, long)
	long.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 24, "repetition_penalty": 1}})
	_, whole := readUntilDone(t, long)
	if whole.FinishReason != "length" {
		t.Fatalf("a 24-token reply: %+v", whole)
	}

	ws := dial(t, s.url+"/ws?format=json", nil)
	id := readJSON(t, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "continue"})
	if m := readJSON(t, ws); m.Type != "error" || m.Code != "invalid" {
		t.Fatalf("continue with no reply: %+v", m)
	}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 12, "repetition_penalty": 1}})
	_, first := readUntilDone(t, ws)
	if first.FinishReason != "length" {
		t.Fatalf("a 12-token reply: %+v", first)
	}
	ws.WriteJSON(map[string]any{"type": "continue", "params": map[string]any{"max_tokens": 12, "repetition_penalty": 1}})
	toks, done := readUntilDone(t, ws)
	text := ""
	for _, tk := range toks {
		text += tk.Text
	}
	if done.Type != "done" || done.Content != first.Content+text {
		t.Fatalf("continue: %d tokens %q, done %+v; the reply was %q", len(toks), text, done, first.Content)
	}
	if done.Content != whole.Content {
		t.Errorf("12 tokens and 12 more make %q\none reply of 24 is %q", done.Content, whole.Content)
	}
	got := stored(t, s, id)
	if len(got) != 2 || got[1].Content != done.Content || got[1].Interrupted {
		t.Fatalf("after continue the session holds %+v", got)
	}
}

// TestResumeDuringAContinue: a socket that drops while a continue streams
// and resumes sees the conversation's prompt and the reply whole so far
// (the continued text, then the new tokens), not the socket's last prompt
// and the new tokens alone; the reply then ends whole.
func TestResumeDuringAContinue(t *testing.T) {
	s := openPaced(t, 5*time.Millisecond, func(c *web.Config) { c.ResumeGrace = 5 * time.Second })
	ws := dial(t, s.url+"/ws?format=json", nil)
	id := readJSON(t, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 8}})
	_, first := readUntilDone(t, ws)
	ws.WriteJSON(map[string]any{"type": "continue", "params": map[string]any{"max_tokens": 200}})
	if m := readJSON(t, ws); m.Type != "token" {
		t.Fatalf("continue: %+v", m)
	}
	dropAbruptly(ws)
	ws2 := dial(t, s.url+"/ws?format=json&session="+id, nil)
	open := readJSON(t, ws2)
	if open.Reply == nil || len(open.Messages) != 2 || open.Messages[0].Content != "Once upon a time" ||
		!strings.HasPrefix(open.Messages[1].Content, first.Content) || len(open.Messages[1].Content) <= len(first.Content) {
		t.Fatalf("resumed during a continue of %q: %+v", first.Content, open)
	}
	_, done := readUntilDone(t, ws2)
	if !strings.HasPrefix(done.Content, open.Messages[1].Content) {
		t.Fatalf("the continued reply %q does not start with what the resume showed, %q", done.Content, open.Messages[1].Content)
	}
}
