package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/web"
)

// gptOSSCallingModel is a gpt-oss-style model with gpt-oss's template that thinks, then calls get_weather as harmony
// does: a commentary-channel message to functions.get_weather, ended by <|call|>.
func gptOSSCallingModel(tb testing.TB) string {
	s := synth.Harmony()
	s.Template = realTemplate(tb, "openai-gpt-oss-120b")
	s.Text = []string{"assistant"}
	s.After = "assistant"
	s.Reply = "<|channel|>analysis<|message|>" + ossThought + "<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json" +
		`<|message|>{"city": "Paris", "unit": "c"}<|call|>`
	return testmodel.Scripted(tb, s)
}

// TestHarmonyToolCalls: gpt-oss's call (a commentary message to=functions.NAME) is a tool call on every API, as
// other families' calls are: OpenAI chat (tool_calls, finish_reason tool_calls, no content, the thought apart, and
// streamed as tool_calls deltas; with tool_choice none neither a call nor its arguments as text), the Responses API (a function_call item after the reasoning item) and Ollama's
// /api/chat; the call and its result go back in the history.
func TestHarmonyToolCalls(t *testing.T) {
	s := openStack(t, stackOpts{model: gptOSSCallingModel(t), parallel: 1, contextLen: 4096, maxTokens: 100, tokenizer: true,
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
	msgs := []map[string]any{{"role": "user", "content": "Weather in Paris?"}}
	var res struct {
		Choices []struct {
			Message struct {
				Content          *string       `json:"content"`
				ReasoningContent string        `json:"reasoning_content"`
				ToolCalls        []oaiToolCall `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	decodeBody(t, post(t, s.base+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": weatherTools}), http.StatusOK, &res)
	msg := res.Choices[0].Message
	if res.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.Content != nil || msg.ReasoningContent != ossThought {
		c := ""
		if msg.Content != nil {
			c = *msg.Content
		}
		t.Fatalf("reply %+v content %q", res.Choices[0], c)
	}
	call := msg.ToolCalls[0]
	if call.Function.Name != "get_weather" || !strings.HasPrefix(call.ID, "call_") {
		t.Fatalf("call %+v", call)
	}
	checkWeatherArgs(t, call.Function.Arguments)

	// tool_choice none: the model's call is no answer text (other families' replies end at the trigger).
	res.Choices = nil
	decodeBody(t, post(t, s.base+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": weatherTools, "tool_choice": "none"}), http.StatusOK, &res)
	if m := res.Choices[0].Message; len(m.ToolCalls) != 0 || m.Content == nil || *m.Content != "" {
		t.Fatalf("tool_choice none: %+v", res.Choices[0])
	}

	// Streamed: the call's deltas, no content.
	sse := readSSE(t, post(t, s.base+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": weatherTools, "stream": true}).Body, "data: ")
	var name, args, content, finish string
	for _, e := range sse[:len(sse)-1] {
		var c oaiToolChunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			content += ch.Delta.Content
			for _, tc := range ch.Delta.ToolCalls {
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if name != "get_weather" || content != "" || finish != "tool_calls" {
		t.Fatalf("streamed: name %q content %q finish %q", name, content, finish)
	}
	checkWeatherArgs(t, args)

	// The Responses API: a reasoning item, then the function_call.
	var resp struct {
		Output []struct {
			Type      string `json:"type"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"output"`
	}
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Weather in Paris?", "tools": []map[string]any{{
		"type": "function", "name": "get_weather", "parameters": weatherTools[0]["function"].(map[string]any)["parameters"]}}}), http.StatusOK, &resp)
	if len(resp.Output) != 2 || resp.Output[0].Type != "reasoning" || resp.Output[1].Type != "function_call" || resp.Output[1].Name != "get_weather" {
		t.Fatalf("responses output %+v", resp.Output)
	}
	checkWeatherArgs(t, resp.Output[1].Arguments)

	// Ollama's /api/chat.
	model := tagsName(t, s)
	var oll struct {
		Message struct {
			Content   string          `json:"content"`
			ToolCalls []ollamaCallOut `json:"tool_calls"`
		} `json:"message"`
	}
	decodeBody(t, post(t, s.base+"/api/chat", map[string]any{"model": model, "messages": msgs, "tools": weatherTools, "stream": false}), http.StatusOK, &oll)
	if oll.Message.Content != "" || len(oll.Message.ToolCalls) != 1 || oll.Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("ollama reply %+v", oll.Message)
	}
	checkWeatherArgs(t, string(oll.Message.ToolCalls[0].Function.Arguments))

	// The call and its result go back: the template renders them in harmony.
	history := append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": call.ID, "type": "function",
		"function": map[string]any{"name": "get_weather", "arguments": call.Function.Arguments}}}},
		map[string]any{"role": "tool", "tool_call_id": call.ID, "content": `{"temp": 21}`})
	decodeBody(t, post(t, s.base+"/v1/chat/completions", map[string]any{"messages": history, "tools": weatherTools}), http.StatusOK, &res)
}
