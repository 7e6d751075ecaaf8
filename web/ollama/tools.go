package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Tool calling on /api/chat, as Ollama does it: the request's tools are
// OpenAI's function tools; a reply's calls come back as message.tool_calls
// with arguments as a JSON object (streamed: in one object before the last,
// once the call is complete); an assistant message's tool_calls and the
// role "tool" messages that answer them (by tool_name, else in order) go
// back in the history. Ollama has no tool_choice: the model decides (auto),
// and the calls it makes are constrained by the tools' schemas, as on every
// API of Parley's.

// ollamaToolCall is a call in a message.
type ollamaToolCall struct {
	ID       string `json:"id,omitempty"`
	Function struct {
		Index     *int            `json:"index,omitempty"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// ollamaToolCalls is calls as a message's tool_calls (arguments as objects).
func ollamaToolCalls(calls []parley.ToolCall) []ollamaToolCall {
	out := make([]ollamaToolCall, len(calls))
	for i, c := range calls {
		out[i].ID = c.ID
		idx := i
		out[i].Function.Index = &idx
		out[i].Function.Name = c.Name
		args := json.RawMessage(c.Arguments)
		if !json.Valid(args) {
			args = json.RawMessage("{}") // unreachable: calls are generated under their schema's grammar
		}
		out[i].Function.Arguments = args
	}
	return out
}

// parseOllamaToolCalls turns an assistant message's tool_calls into calls,
// giving each an id (Ollama's clients send none) that tool results are
// matched to.
func parseOllamaToolCalls(in []ollamaToolCall, role parley.Role, i int, field string) ([]parley.ToolCall, error) {
	if len(in) > 0 && role != parley.RoleAssistant {
		return nil, parley.FieldErrorf(field+".tool_calls", "only assistant messages make tool calls")
	}
	var calls []parley.ToolCall
	for j, c := range in {
		f := fmt.Sprintf("%s.tool_calls[%d].function", field, j)
		if c.Function.Name == "" {
			return nil, parley.FieldErrorf(f+".name", "is required")
		}
		args := bytes.TrimSpace(c.Function.Arguments)
		if !apicore.IsSet(args) {
			args = []byte("{}")
		}
		if args[0] != '{' {
			return nil, parley.FieldErrorf(f+".arguments", "must be a JSON object")
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, args); err != nil {
			return nil, parley.FieldErrorf(f+".arguments", "must be a JSON object")
		}
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", i, j)
		}
		calls = append(calls, parley.ToolCall{ID: id, Name: c.Function.Name, Arguments: compact.String()})
	}
	return calls, nil
}

// answerToolResults ties each role "tool" message to the call it answers:
// the earliest unanswered call of an earlier assistant message with its
// tool_name, or the earliest unanswered one when it names none.
func answerToolResults(msgs []parley.Message) error {
	var open []parley.ToolCall
	for i := range msgs {
		m := &msgs[i]
		open = append(open, m.ToolCalls...)
		if m.Role != parley.RoleTool {
			continue
		}
		k := -1
		for j, c := range open {
			if m.Name == "" || c.Name == m.Name {
				k = j
				break
			}
		}
		if k < 0 {
			what := "no tool call is open"
			if m.Name != "" {
				what = fmt.Sprintf("no open tool call is to %q", m.Name)
			}
			return parley.FieldErrorf(fmt.Sprintf("messages[%d]", i), "is a tool result, but %s in the messages before it", what)
		}
		m.ToolCallID, m.Name = open[k].ID, open[k].Name
		open = append(open[:k], open[k+1:]...)
	}
	return nil
}
