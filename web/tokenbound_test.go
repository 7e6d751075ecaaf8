package web_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/web"
)

// qwenToolsModel is a scripted ChatML model with Qwen 2.5's tool template
// (tools written with tojson, tool calls in <tool_call> tags, a user-defined
// token): it answers "Hello." and ends.
func qwenToolsModel(tb testing.TB) string {
	src, err := os.ReadFile("../chat/testdata/qwen2.5-tools.jinja")
	if err != nil {
		tb.Fatal(err)
	}
	return testmodel.Scripted(tb, &synth.Script{
		Template: string(src),
		Control:  []string{"<|im_start|>", "<|im_end|>"},
		Text:     []string{"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"},
		After:    "\n",
		Reply:    "Hello.<|im_end|>",
	})
}

func openQwenStack(tb testing.TB, maxPrompt int) *stack {
	return openStack(tb, stackOpts{model: qwenToolsModel(tb), parallel: 1, contextLen: 2048, maxTokens: 8, tokenizer: true,
		cfg: func(c *web.Config) { c.MaxPromptTokens = maxPrompt },
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
}

// bigTool is a function tool whose parameters' description is n bytes of text.
func bigTool(name string, n int) map[string]any {
	return map[string]any{"type": "function", "function": map[string]any{"name": name, "description": "A tool.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{
			"q": map[string]any{"type": "string", "description": strings.Repeat("lorem ipsum dolor ", n/18)}}}}}
}

// TestPromptLimitCountsEverything: --max-prompt-tokens holds the whole
// prompt: tool definitions count (a request with a small message and large
// tools is refused; the same message alone is answered), every message
// counts (6,000 empty assistant messages are refused, and cheaply: the
// rendered prompt is tokenized only until it is over the cap), and a tools
// array of about 4 MB is refused without being tokenized in full.
func TestPromptLimitCountsEverything(t *testing.T) {
	s := openQwenStack(t, 1000)
	msgs := []map[string]any{{"role": "user", "content": "Hi"}}
	status := func(body map[string]any) (int, string) {
		t.Helper()
		res := post(t, s.base+"/v1/chat/completions", body)
		defer res.Body.Close()
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		json.NewDecoder(res.Body).Decode(&e)
		return res.StatusCode, e.Error.Message
	}
	if code, msg := status(map[string]any{"messages": msgs, "max_tokens": 4}); code != http.StatusOK {
		t.Fatalf("a short request: %d %s", code, msg)
	}
	// About 1,200 tokens of tool schema: over the cap, with a 1-token message.
	if code, msg := status(map[string]any{"messages": msgs, "max_tokens": 4, "tools": []any{bigTool("search", 4000)}}); code != http.StatusRequestEntityTooLarge {
		t.Errorf("tools over the cap: %d %s, want 413", code, msg)
	}
	// 6,000 empty assistant messages: no text, 12,000 role markers.
	var many []map[string]any
	for range 6000 {
		many = append(many, map[string]any{"role": "assistant", "content": ""})
	}
	many = append(many, map[string]any{"role": "user", "content": "Hi"})
	start := time.Now()
	if code, msg := status(map[string]any{"messages": many, "max_tokens": 4}); code != http.StatusRequestEntityTooLarge {
		t.Errorf("6,000 messages: %d %s, want 413", code, msg)
	}
	t.Logf("6,000 empty messages refused in %v", time.Since(start))
	// 3,000 messages pass the count of messages (at most 1,000) only as
	// rendered markup: refused by the responder's count of the prompt.
	s2 := openQwenStack(t, 4000)
	many = many[3000:]
	res := post(t, s2.base+"/v1/chat/completions", map[string]any{"messages": many, "max_tokens": 4})
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("3,000 messages (6,000 markers, cap 4,000): %d, want 413", res.StatusCode)
	}
	// About 3.9 MB of tools.
	var tools []any
	for i := range 16 {
		tools = append(tools, bigTool("t"+string(rune('a'+i)), 240<<10))
	}
	start = time.Now()
	if code, msg := status(map[string]any{"messages": msgs, "max_tokens": 4, "tools": tools}); code != http.StatusRequestEntityTooLarge {
		t.Errorf("3.9 MB of tools: %d %s, want 413", code, msg)
	}
	t.Logf("3.9 MB of tools refused in %v", time.Since(start))
}
