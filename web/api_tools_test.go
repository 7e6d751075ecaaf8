package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/web"
)

var weatherTools = []map[string]any{{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "Weather in a city",
	"parameters": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "unit"},
		"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 16}, "unit": map[string]any{"enum": []string{"c", "f"}}}},
}}}

type oaiToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// checkWeatherArgs: the arguments parse and hold what the schema requires.
// oaiToolChunk is a streamed chat completion chunk, with its tool-call deltas.
type oaiToolChunk struct {
	Choices []struct {
		Delta struct {
			Content   string        `json:"content"`
			ToolCalls []oaiToolCall `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func checkWeatherArgs(t *testing.T, args string) {
	t.Helper()
	var a struct {
		City *string `json:"city"`
		Unit string  `json:"unit"`
	}
	dec := json.NewDecoder(strings.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil || a.City == nil || len(*a.City) > 16 || (a.Unit != "c" && a.Unit != "f") {
		t.Fatalf("arguments %q do not validate (%v)", args, err)
	}
}

// TestOpenAIToolCalls: over a real socket, tool_choice required makes
// stories260K call the tool (message.tool_calls, finish_reason tool_calls,
// content null); streamed, the call's id and name come first and its
// arguments over several chunks; the call and its result go back in the
// history and the next reply continues from them.
func TestOpenAIToolCalls(t *testing.T) {
	s := openToolStack(t)
	body := func() map[string]any {
		return map[string]any{"messages": userMsgs("Weather in Paris?"), "tools": weatherTools, "tool_choice": "required", "max_tokens": 200}
	}
	var res struct {
		Choices []struct {
			Message struct {
				Content   *string       `json:"content"`
				ToolCalls []oaiToolCall `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	decodeBody(t, post(t, s.base+"/v1/chat/completions", body()), http.StatusOK, &res)
	msg := res.Choices[0].Message
	if res.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.Content != nil {
		t.Fatalf("reply %+v", res.Choices[0])
	}
	call := msg.ToolCalls[0]
	if call.Type != "function" || !strings.HasPrefix(call.ID, "call_") || call.Function.Name != "get_weather" {
		t.Fatalf("call %+v", call)
	}
	checkWeatherArgs(t, call.Function.Arguments)

	// Streamed: the same call (greedy), in pieces.
	b := body()
	b["stream"] = true
	sse := readSSE(t, post(t, s.base+"/v1/chat/completions", b).Body, "data: ")
	var id, name, args, finish string
	argChunks := 0
	for _, e := range sse[:len(sse)-1] {
		var c oaiToolChunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index == nil || *tc.Index != 0 {
					t.Fatalf("delta without index 0: %s", e)
				}
				if tc.ID != "" {
					if id != "" || args != "" {
						t.Fatalf("id after the call began: %s", e)
					}
					id, name = tc.ID, tc.Function.Name
				}
				if tc.Function.Arguments != "" {
					args += tc.Function.Arguments
					argChunks++
				}
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if finish != "tool_calls" || id == "" || name != "get_weather" || argChunks < 3 || args != call.Function.Arguments {
		t.Fatalf("stream: finish %q id %q name %q, arguments %q in %d chunks (non-streamed: %q)", finish, id, name, args, argChunks, call.Function.Arguments)
	}

	// The call and its result in the history: the reply continues as text.
	msgs := append(userMsgs("Weather in Paris?"),
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": call.ID, "type": "function",
			"function": map[string]any{"name": call.Function.Name, "arguments": call.Function.Arguments}}}},
		map[string]any{"role": "tool", "tool_call_id": call.ID, "content": `{"temperature": 21}`})
	c := chatComplete(t, s, map[string]any{"messages": msgs, "tools": weatherTools, "tool_choice": "none", "max_tokens": 20})
	if c.Choices[0].FinishReason == "tool_calls" {
		t.Fatalf("tool_choice none made a call: %+v", c.Choices[0])
	}
}

// TestOpenAIHostileTools: each hostile tool list or history is a 400 naming
// the field, and the server keeps serving.
func TestOpenAIHostileTools(t *testing.T) {
	s := openToolStack(t)
	tool := func(name string, params any) map[string]any {
		return map[string]any{"type": "function", "function": map[string]any{"name": name, "parameters": params}}
	}
	obj := map[string]any{"type": "object"}
	many := make([]map[string]any, 1000)
	for i := range many {
		many[i] = tool("f"+strings.Repeat("x", i%50), obj)
	}
	recursive := map[string]any{"type": "object", "properties": map[string]any{"next": map[string]any{"$ref": "#"}}}
	cases := []struct {
		name  string
		patch map[string]any
		field string
	}{
		{"1000 tools", map[string]any{"tools": many}, "tools"},
		{"recursive", map[string]any{"tools": []any{tool("walk", recursive)}}, "tools[0].parameters"},
		{"duplicate", map[string]any{"tools": []any{tool("a", obj), tool("a", obj)}}, "tools[1].name"},
		{"bad choice", map[string]any{"tools": []any{tool("a", obj)}, "tool_choice": "sometimes"}, "tool_choice"},
		{"unknown function", map[string]any{"tools": []any{tool("a", obj)}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "b"}}}, "tool_choice"},
		{"unknown call id", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "tool", "tool_call_id": "call_nope", "content": "42"}}}, "messages[1].tool_call_id"},
		{"arguments not JSON", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "a", "arguments": "{oops"}}}}}},
			"messages[1].tool_calls[0].function.arguments"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := map[string]any{"messages": userMsgs("hi"), "max_tokens": 4}
			for k, v := range c.patch {
				body[k] = v
			}
			res := post(t, s.base+"/v1/chat/completions", body)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Param   string `json:"param"`
				} `json:"error"`
			}
			decodeBody(t, res, http.StatusBadRequest, &e)
			if !strings.HasPrefix(e.Error.Message, c.field+":") {
				t.Fatalf("error %+v, want one naming %s", e.Error, c.field)
			}
		})
	}
	chatComplete(t, s, map[string]any{"messages": userMsgs("hi"), "max_tokens": 4})
}

// openToolStack is the stack with the HTTP APIs and a context that holds a
// tool prompt (stories260K spends many tokens on one).
func openToolStack(tb testing.TB) *stack {
	return openStack(tb, stackOpts{parallel: 1, contextLen: 2048, maxTokens: 24, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
}
