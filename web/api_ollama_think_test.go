package web_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/web"
)

// TestOllamaThinking: a reasoning model's thought comes back apart from its
// answer on /api/chat (message.thinking) and /api/generate (thinking), whole
// and streamed (every thought piece before the answer's); /api/show says
// "thinking"; think: true on a model without a thought is a 400.
func TestOllamaThinking(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info),
			web.WithInfo(func() web.Info {
				return web.Info{ModelInfo: s.engine.Info(), Thinking: chat.ThinkFormatOf(s.responder.Template()).String()}
			})}
	}})
	model := ollamaTagsName(t, s)
	var show struct{ Capabilities []string }
	decodeBody(t, post(t, s.base+"/api/show", map[string]any{"model": model}), http.StatusOK, &show)
	if fmt.Sprint(show.Capabilities) != "[completion tools thinking]" { // Qwen3's template takes tools
		t.Fatalf("capabilities %v", show.Capabilities)
	}
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	var whole struct {
		Message struct{ Content, Thinking string } `json:"message"`
	}
	decodeBody(t, post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": msgs, "think": true, "stream": false}), http.StatusOK, &whole)
	if whole.Message.Thinking != qwenThought || whole.Message.Content != qwenAnswer {
		t.Fatalf("thinking %q content %q, want %q %q", whole.Message.Thinking, whole.Message.Content, qwenThought, qwenAnswer)
	}
	var gen struct{ Response, Thinking string }
	decodeBody(t, post(t, s.base+"/api/generate", map[string]any{"model": model, "prompt": "hi", "think": true, "stream": false}), http.StatusOK, &gen)
	if gen.Thinking != qwenThought || gen.Response != qwenAnswer {
		t.Fatalf("generate: thinking %q response %q", gen.Thinking, gen.Response)
	}
	// Streamed: the thought's pieces, then the answer's.
	res := post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": msgs, "think": true})
	var thought, answer strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var o struct {
			Message struct{ Content, Thinking string } `json:"message"`
		}
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		if o.Message.Thinking != "" && answer.Len() > 0 {
			t.Fatalf("a thought piece %q after the answer began", o.Message.Thinking)
		}
		thought.WriteString(o.Message.Thinking)
		answer.WriteString(o.Message.Content)
	}
	if thought.String() != qwenThought || answer.String() != qwenAnswer {
		t.Fatalf("streamed thinking %q content %q", thought.String(), answer.String())
	}
	wantOllamaError(t, post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": msgs, "think": "very"}), http.StatusBadRequest, "think")
}

func ollamaTagsName(tb testing.TB, s *stack) string {
	tb.Helper()
	res, err := http.Get(s.base + "/api/tags")
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	var tags struct{ Models []struct{ Name string } }
	decodeBody(tb, res, http.StatusOK, &tags)
	return tags.Models[0].Name
}
