package apicore

import (
	"encoding/json"
	"fmt"

	"github.com/parley-chat/parley"
)

// OpenAI's tool definitions are the lingua franca of tool calling: OpenAI's
// chat completions, Ollama's /api/chat, the Responses API's tool_choice and
// the chat socket take them in this shape.

// openAITool is one entry of a request's tools.
type openAITool struct {
	Type     string `json:"type"`
	Function *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      *bool           `json:"strict"`
	} `json:"function"`
}

// ParseTools decodes OpenAI's tools (only "function" tools).
func ParseTools(raw json.RawMessage, field string) ([]parley.Tool, error) {
	if !IsSet(raw) {
		return nil, nil
	}
	var in []openAITool
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, parley.FieldErrorf(field, "must be an array of {\"type\": \"function\", \"function\": {...}}")
	}
	if len(in) > parley.MaxTools {
		return nil, parley.FieldErrorf(field, "at most %d tools, got %d", parley.MaxTools, len(in))
	}
	tools := make([]parley.Tool, 0, len(in))
	for i, t := range in {
		f := fmt.Sprintf("%s[%d]", field, i)
		if t.Type != "function" {
			return nil, parley.FieldErrorf(f+".type", "only \"function\" tools are supported, got %q", t.Type)
		}
		if t.Function == nil {
			return nil, parley.FieldErrorf(f+".function", "is required")
		}
		tools = append(tools, parley.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}
	return tools, nil
}

// ParseToolChoice decodes "auto", "none", "required" or
// {"type": "function", "function": {"name": ...}}.
func ParseToolChoice(raw json.RawMessage, field string) (parley.ToolChoice, error) {
	if !IsSet(raw) {
		return parley.ToolChoice{}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case parley.ToolAuto, parley.ToolNone, parley.ToolRequired:
			return parley.ToolChoice{Mode: s}, nil
		}
		return parley.ToolChoice{}, parley.FieldErrorf(field, "must be auto, none, required or a function, got %q", s)
	}
	var obj struct {
		Type     string `json:"type"`
		Name     string `json:"name"` // the Responses API's form
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Type != "function" {
		return parley.ToolChoice{}, parley.FieldErrorf(field, "must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
	}
	name := obj.Name
	if obj.Function != nil {
		name = obj.Function.Name
	}
	if name == "" {
		return parley.ToolChoice{}, parley.FieldErrorf(field, "names no function")
	}
	return parley.ToolChoice{Mode: parley.ToolFunction, Name: name}, nil
}

// AddTools is a ResolveParams step that decodes OpenAI's tools and
// tool_choice, their fields named under prefix ("" at the top level).
func AddTools(tools, choice json.RawMessage, prefix string) func(*parley.Params) error {
	return func(p *parley.Params) (err error) {
		if p.Tools, err = ParseTools(tools, prefix+"tools"); err != nil {
			return err
		}
		p.ToolChoice, err = ParseToolChoice(choice, prefix+"tool_choice")
		return err
	}
}
