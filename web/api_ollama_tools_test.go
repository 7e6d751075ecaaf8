package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/web"
)

// toolCallingModel is a scripted Hermes-style model whose template takes
// tools: it says something, then calls get_weather in <tool_call> tags.
func toolCallingModel(tb testing.TB) string {
	return testmodel.Scripted(tb, &synth.Script{
		Template: "{% if tools %}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
			"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
		Control: []string{"<|im_start|>", "<|im_end|>"},
		Text:    []string{"<tool_call>", "</tool_call>"},
		After:   "\n",
		Reply:   `Let me look that up.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call><|im_end|>`,
	})
}

type ollamaCallOut struct {
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// TestOllamaToolCalls: a model that calls a tool answers /api/chat with
// message.tool_calls (arguments an object that validates), whole and
// streamed (the call in one object before the last); the call and its
// result go back in the history; /api/show says "tools".
func TestOllamaToolCalls(t *testing.T) {
	s := openStack(t, stackOpts{model: toolCallingModel(t), parallel: 1, contextLen: 2048, maxTokens: 100, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	model := tagsName(t, s)
	var show struct{ Capabilities []string }
	decodeBody(t, post(t, s.base+"/api/show", map[string]any{"model": model}), http.StatusOK, &show)
	if fmt.Sprint(show.Capabilities) != "[completion tools]" {
		t.Fatalf("capabilities %v", show.Capabilities)
	}
	msgs := []map[string]any{{"role": "user", "content": "Weather in Paris?"}}
	body := map[string]any{"model": model, "messages": msgs, "tools": weatherTools, "stream": false}
	var whole struct {
		Message struct {
			Content   string          `json:"content"`
			ToolCalls []ollamaCallOut `json:"tool_calls"`
		} `json:"message"`
		DoneReason string `json:"done_reason"`
	}
	decodeBody(t, post(t, s.base+"/api/chat", body), http.StatusOK, &whole)
	if whole.Message.Content != "Let me look that up." || len(whole.Message.ToolCalls) != 1 || whole.DoneReason != "stop" {
		t.Fatalf("reply %+v", whole)
	}
	call := whole.Message.ToolCalls[0]
	if call.Function.Name != "get_weather" {
		t.Fatalf("call %+v", call)
	}
	checkWeatherArgs(t, string(call.Function.Arguments))

	delete(body, "stream")
	res := post(t, s.base+"/api/chat", body)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(readAllString(t, res)), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, v)
	}
	n := len(lines)
	if n < 3 || lines[n-1]["done"] != true {
		t.Fatalf("stream %v", lines)
	}
	calls, _ := lines[n-2]["message"].(map[string]any)["tool_calls"].([]any)
	if len(calls) != 1 || lines[n-2]["done"] != false {
		t.Fatalf("the object before the last %v: want the call", lines[n-2])
	}

	// The call and its result go back; a result that answers no call is refused.
	history := append(msgs, map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{
		"function": map[string]any{"name": "get_weather", "arguments": map[string]any{"city": "Paris", "unit": "c"}}}}},
		map[string]any{"role": "tool", "tool_name": "get_weather", "content": `{"temp": 21}`})
	decodeBody(t, post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": history, "tools": weatherTools, "stream": false}), http.StatusOK, &whole)
	bad := append(append([]map[string]any(nil), history...), map[string]any{"role": "tool", "tool_name": "get_time", "content": "noon"})
	wantOllamaError(t, post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": bad}), http.StatusBadRequest, "messages[3]")
	wantOllamaError(t, post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": msgs, "tools": "x"}), http.StatusBadRequest, "tools")
}

func tagsName(tb testing.TB, s *stack) string {
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

func readAllString(tb testing.TB, res *http.Response) string {
	tb.Helper()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}
