package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Tool use on the Messages API, over the tool calling the OpenAI routes use
// (parley.Params' tools, a grammar from their schemas, so every call parses
// and validates): the request's tools ({name, description, input_schema})
// and tool_choice (auto, any, tool, none); tool_use blocks in assistant
// turns and tool_result blocks in user turns; the reply's tool_use blocks,
// streamed as a content block whose input arrives as input_json_delta; and
// stop_reason "tool_use". A reply makes at most one call.

// anthropicTool is one entry of a request's tools. Only custom tools are
// served (Anthropic's server tools, such as bash or web search, have a
// type of their own).
type anthropicTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// parseAnthropicTools decodes tools into Parley's.
func parseAnthropicTools(raw json.RawMessage) ([]parley.Tool, error) {
	if !apicore.IsSet(raw) {
		return nil, nil
	}
	var in []json.RawMessage
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, parley.FieldErrorf("tools", "must be an array of tools ({\"name\", \"description\", \"input_schema\"})")
	}
	if len(in) > parley.MaxTools {
		return nil, parley.FieldErrorf("tools", "at most %d tools, got %d", parley.MaxTools, len(in))
	}
	tools := make([]parley.Tool, 0, len(in))
	for i, r := range in {
		f := fmt.Sprintf("tools[%d]", i)
		var t anthropicTool
		if err := json.Unmarshal(r, &t); err != nil {
			return nil, parley.FieldErrorf(f, "must be a tool object ({\"name\", \"description\", \"input_schema\"})")
		}
		if t.Type != "" && t.Type != "custom" {
			return nil, parley.FieldErrorf(f+".type", "server tools (%q) are not supported: give custom tools with an input_schema", t.Type)
		}
		if !apicore.IsSet(t.InputSchema) {
			return nil, parley.FieldErrorf(f+".input_schema", "is required")
		}
		tools = append(tools, parley.Tool{Name: t.Name, Description: t.Description, Parameters: t.InputSchema})
	}
	return tools, nil
}

// parseAnthropicToolChoice decodes {"type": "auto" | "any" | "none"} or
// {"type": "tool", "name": ...}; disable_parallel_tool_use is accepted (a
// reply makes at most one call).
func parseAnthropicToolChoice(raw json.RawMessage) (parley.ToolChoice, error) {
	if !apicore.IsSet(raw) {
		return parley.ToolChoice{}, nil
	}
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return parley.ToolChoice{}, parley.FieldErrorf("tool_choice", "must be an object with a type: auto, any, tool or none")
	}
	switch tc.Type {
	case "auto":
		return parley.ToolChoice{Mode: parley.ToolAuto}, nil
	case "any":
		return parley.ToolChoice{Mode: parley.ToolRequired}, nil
	case "none":
		return parley.ToolChoice{Mode: parley.ToolNone}, nil
	case "tool":
		if tc.Name == "" {
			return parley.ToolChoice{}, parley.FieldErrorf("tool_choice.name", "is required with type tool")
		}
		return parley.ToolChoice{Mode: parley.ToolFunction, Name: tc.Name}, nil
	}
	return parley.ToolChoice{}, parley.FieldErrorf("tool_choice.type", "must be auto, any, tool or none, got %q", tc.Type)
}

// renameToolField renames the fields Parley's tool validation names to the
// Messages API's: a tool's parameters are its input_schema, and a
// tool_choice naming a function names tool_choice.name.
func renameToolField(err error) error {
	f := apicore.ErrorField(err)
	switch {
	case strings.HasPrefix(f, "tools[") && strings.Contains(f, "].parameters"):
		i := strings.Index(f, "].parameters")
		return apicore.RenameField(err, f, f[:i]+"].input_schema"+f[i+len("].parameters"):])
	case f == "tool_choice" && strings.Contains(parley.ErrorMessage(err), "names"):
		return apicore.RenameField(err, f, "tool_choice.name")
	}
	return err
}

// anthropicToolUse is a tool_use block of a request.
type anthropicToolUse struct {
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// toolUseCall turns an assistant's tool_use block into a call; ids maps
// the ids of the calls seen so far to their tools' names.
func toolUseCall(raw json.RawMessage, field string, ids map[string]string) (parley.ToolCall, error) {
	var u anthropicToolUse
	if err := json.Unmarshal(raw, &u); err != nil {
		return parley.ToolCall{}, parley.FieldErrorf(field, "must be a tool_use block ({\"id\", \"name\", \"input\"})")
	}
	if u.ID == "" {
		return parley.ToolCall{}, parley.FieldErrorf(field+".id", "is required")
	}
	if u.Name == "" {
		return parley.ToolCall{}, parley.FieldErrorf(field+".name", "is required")
	}
	args := bytes.TrimSpace(u.Input)
	if len(args) == 0 || args[0] != '{' {
		return parley.ToolCall{}, parley.FieldErrorf(field+".input", "must be an object")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, args); err != nil {
		return parley.ToolCall{}, parley.FieldErrorf(field+".input", "must be an object")
	}
	ids[u.ID] = u.Name
	return parley.ToolCall{ID: u.ID, Name: u.Name, Arguments: compact.String()}, nil
}

// anthropicToolResult is a tool_result block of a request.
type anthropicToolResult struct {
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// toolResultMessage turns a user's tool_result block into a tool message.
// Its content is a string or text blocks; a result flagged is_error is
// shown to the model as an error.
func toolResultMessage(raw json.RawMessage, field string, ids map[string]string) (parley.Message, error) {
	var r anthropicToolResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return parley.Message{}, parley.FieldErrorf(field, "must be a tool_result block ({\"tool_use_id\", \"content\"})")
	}
	if r.ToolUseID == "" {
		return parley.Message{}, parley.FieldErrorf(field+".tool_use_id", "is required")
	}
	name, ok := ids[r.ToolUseID]
	if !ok {
		return parley.Message{}, parley.FieldErrorf(field+".tool_use_id", "%q answers no tool_use block of an earlier assistant message", r.ToolUseID)
	}
	content := ""
	if apicore.IsSet(r.Content) {
		var err error
		if content, err = apicore.ParseContent(r.Content, field+".content"); err != nil {
			return parley.Message{}, err
		}
	}
	if r.IsError {
		content = "Error: " + content
	}
	return parley.Message{Role: parley.RoleTool, Content: content, ToolCallID: r.ToolUseID, Name: name}, nil
}

// anthropicToolUseOut is a reply's tool_use block.
func anthropicToolUseOut(c parley.ToolCall) anthropicContent {
	input := json.RawMessage(c.Arguments)
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage("{}")
	}
	return anthropicContent{Type: "tool_use", ID: c.ID, Name: c.Name, Input: input}
}
