package chat

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
)

// TestToolStream splits replies, fed in pieces of every size, into content
// and calls: text around a call is content, a call's arguments stream, text
// after a trigger that is no call is content again, and a call whose
// arguments break the schema (a number bound no grammar enforces) is not
// returned.
func TestToolStream(t *testing.T) {
	tools := []parley.Tool{{Name: "set", Parameters: json.RawMessage(`{"type":"object","properties":{"x":{"type":"number","maximum":5}},"required":["x"]}`)}}
	cases := []struct {
		name    string
		syn     parley.ToolSyntax
		forced  bool
		text    string
		content string
		calls   []string // name(arguments)
	}{
		{"hermes", hermesSyntax, false, "Sure.<tool_call>\n{\"name\": \"set\", \"arguments\": {\"x\": 1.5}}\n</tool_call>", "Sure.", []string{`set({"x": 1.5})`}},
		{"no space", hermesSyntax, false, `<tool_call>{"name":"set","arguments":{"x":"}"}}</tool_call>`, "", nil},
		{"braces in strings", hermesSyntax, false, `<tool_call>{"name":"set","arguments":{"x":2,"y":"}{\"}"}}</tool_call>after`, "after", []string{`set({"x":2,"y":"}{\"}"})`}},
		{"over the bound", hermesSyntax, false, `a<tool_call>{"name": "set", "arguments": {"x": 9}}</tool_call>`, "a", nil},
		{"not a call", hermesSyntax, false, "x <tool_call> is a tag I like", "x <tool_call> is a tag I like", nil},
		{"unknown tool", hermesSyntax, false, `<tool_call>{"name": "rm", "arguments": {}}</tool_call>`, `<tool_call>{"name": "rm", "arguments": {}}</tool_call>`, nil},
		{"trigger prefix at the end", hermesSyntax, false, "hello <tool", "hello <tool", nil},
		{"llama3 forced", llama3Syntax, true, `{"name": "set", "parameters": {"x": 3}}`, "", []string{`set({"x": 3})`}},
		{"mistral", mistralSyntax, false, `[TOOL_CALLS] [{"name": "set", "arguments": {"x": 0}}]`, "", []string{`set({"x": 0})`}},
	}
	for _, c := range cases {
		for _, size := range []int{1, 2, 3, 7, 1000} {
			ts := newToolStream(c.syn, tools, c.forced)
			var content strings.Builder
			args := map[int]string{}
			for i := 0; i < len(c.text); i += size {
				piece := c.text[i:min(i+size, len(c.text))]
				out, d := ts.Push(piece)
				content.WriteString(out)
				if d != nil {
					args[d.Index] += d.Arguments
				}
			}
			content.WriteString(ts.Flush())
			var calls []string
			for i, call := range ts.Calls() {
				calls = append(calls, call.Name+"("+call.Arguments+")")
				if args[i] != call.Arguments {
					t.Errorf("%s/%d: streamed arguments %q, call %q", c.name, size, args[i], call.Arguments)
				}
			}
			if content.String() != c.content || strings.Join(calls, ";") != strings.Join(c.calls, ";") {
				t.Errorf("%s/%d: content %q calls %v, want %q %v", c.name, size, content.String(), calls, c.content, c.calls)
			}
		}
	}
}
