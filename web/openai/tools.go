package openai

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// OpenAI's tool calling on chat completions: the request's tools,
// tool_choice and parallel_tool_calls; assistant tool_calls and role "tool"
// messages in the history; the reply's message.tool_calls, or streamed
// delta.tool_calls (index, id and function.name first, then
// function.arguments over several chunks); finish_reason "tool_calls".
// The calls are constrained by a grammar built from the tools' schemas (see
// parley.Params), so every call returned parses and validates.

// openAIFunctionCall is a call's function: its name and its arguments as JSON text.
type openAIFunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// openAIToolCall is a call in a message (Index only in streamed deltas).
type openAIToolCall struct {
	Index    *int               `json:"index,omitempty"`
	ID       string             `json:"id,omitempty"`
	Type     string             `json:"type,omitempty"`
	Function openAIFunctionCall `json:"function"`
}

// checkToolResults refuses a tool message that answers no earlier call:
// its tool_call_id must be the id of a call an assistant message made.
func checkToolResults(msgs []parley.Message) error {
	ids := map[string]string{}
	for i, m := range msgs {
		for _, c := range m.ToolCalls {
			ids[c.ID] = c.Name
		}
		if m.Role != parley.RoleTool {
			continue
		}
		field := fmt.Sprintf("messages[%d].tool_call_id", i)
		if m.ToolCallID == "" {
			return parley.FieldErrorf(field, "is required on a tool message")
		}
		name, ok := ids[m.ToolCallID]
		if !ok {
			return parley.FieldErrorf(field, "%q answers no tool call of an earlier assistant message", m.ToolCallID)
		}
		if msgs[i].Name == "" {
			msgs[i].Name = name
		}
	}
	return nil
}

// parseChatMessage decodes message i of a chat request, tool calls and
// tool results included.
func parseChatMessage(m openAIMessage, i int, images *apicore.ImageBatch) (parley.Message, error) {
	field := fmt.Sprintf("messages[%d]", i)
	var role parley.Role
	if m.Role == "tool" {
		role = parley.RoleTool
	} else {
		r, err := apicore.ParseRole(m.Role, field+".role")
		if err != nil {
			return parley.Message{}, err
		}
		role = r
	}
	var calls []parley.ToolCall
	for j, c := range m.ToolCalls {
		f := fmt.Sprintf("%s.tool_calls[%d]", field, j)
		if role != parley.RoleAssistant {
			return parley.Message{}, parley.FieldErrorf(field+".tool_calls", "only assistant messages make tool calls")
		}
		if c.ID == "" || c.Function.Name == "" {
			return parley.Message{}, parley.FieldErrorf(f, "needs an id and a function name")
		}
		if c.Function.Arguments != "" && !json.Valid([]byte(c.Function.Arguments)) {
			return parley.Message{}, parley.FieldErrorf(f+".function.arguments", "must be JSON text")
		}
		calls = append(calls, parley.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	content := ""
	var imgs []parley.ImagePart
	raw := bytes.TrimSpace(m.Content)
	if !(len(calls) > 0 && (len(raw) == 0 || bytes.Equal(raw, []byte("null")))) {
		var err error
		// A user's message may hold images (image_url parts); other roles' content is text.
		imageTypes := []string{}
		if role == parley.RoleUser {
			imageTypes = append(imageTypes, "image_url")
		}
		if content, imgs, err = apicore.ParseContentParts(m.Content, field+".content", images, []string{"text"}, imageTypes...); err != nil {
			return parley.Message{}, err
		}
	}
	if role != parley.RoleTool && len(imgs) == 0 {
		if err := apicore.CheckNotEmpty(role, content, field+".content"); err != nil {
			return parley.Message{}, err
		}
	}
	return parley.Message{Role: role, Content: content, Images: imgs, Reasoning: apicore.AssistantReasoning(role, m.ReasoningContent),
		ToolCalls: calls, ToolCallID: m.ToolCallID, Name: m.Name}, nil
}

// openAIToolCalls is calls as a message's tool_calls.
func openAIToolCalls(calls []parley.ToolCall) []openAIToolCall {
	out := make([]openAIToolCall, len(calls))
	for i, c := range calls {
		out[i] = openAIToolCall{ID: c.ID, Type: "function", Function: openAIFunctionCall{Name: c.Name, Arguments: c.Arguments}}
	}
	return out
}

// openAIToolDelta is d as a streamed delta.tool_calls entry.
func openAIToolDelta(d parley.ToolCallDelta) []openAIToolCall {
	i := d.Index
	c := openAIToolCall{Index: &i, ID: d.ID, Function: openAIFunctionCall{Name: d.Name, Arguments: d.Arguments}}
	if d.ID != "" {
		c.Type = "function"
	}
	return []openAIToolCall{c}
}
