package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/ardanlabs/jinja"

	"github.com/parley-chat/parley"
)

// The variables a GGUF's Jinja chat template is rendered with, in the shapes Hugging Face's apply_chat_template
// passes them (and llama.cpp's server copies): OpenAI-style messages with tool_calls whose arguments are objects,
// reasoning_content on assistant turns, tools as {"type":"function","function":{...}}. Struct field order is the
// key order a template sees when it iterates a message or a tool (tojson, items()).

type hfVars struct {
	Messages            []hfMessage `json:"messages"`
	AddGenerationPrompt bool        `json:"add_generation_prompt"`
	BOSToken            string      `json:"bos_token"`
	EOSToken            string      `json:"eos_token"`
	Tools               []hfTool    `json:"tools"` // null without tools, as HF passes tools=None
	EnableThinking      *bool       `json:"enable_thinking,omitempty"`
	// Now is the Unix time strftime_now formats (seconds); fixed by tests so that dated templates render stably.
	Now int64 `json:"now"`
}

type hfMessage struct {
	Role             string       `json:"role"`
	Content          any          `json:"content"` // a string, or parts (a message with images, typedImages)
	ReasoningContent string       `json:"reasoning_content,omitempty"`
	Thinking         string       `json:"thinking,omitempty"` // gpt-oss's templates read the thought here
	ToolCalls        []hfToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string       `json:"tool_call_id,omitempty"`
	Name             string       `json:"name,omitempty"`
}

type hfToolCall struct {
	ID       string         `json:"id,omitempty"`
	Type     string         `json:"type"`
	Function hfCallFunction `json:"function"`
}

type hfCallFunction struct {
	Name string `json:"name"`
	// Arguments is the call's arguments as an object when they parse as JSON (templates write them with tojson, as
	// HF and llama.cpp pass them), else the text as a string.
	Arguments json.RawMessage `json:"arguments"`
}

type hfTool struct {
	Type     string         `json:"type"`
	Function hfToolFunction `json:"function"`
}

type hfToolFunction struct {
	Name string `json:"name"`
	// Description is always passed, "" when the request gave none: OpenAI takes a tool without one, and templates
	// that write "// " + tool.description (gpt-oss) would otherwise fail on an undefined value, as they do in jinja2.
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// buildVars returns the template variables for msgs as JSON. thinkingKey says whether the thought is also passed as
// "thinking" (the gpt-oss templates' name for it).
// With typedImages a message with images has its content as parts (imageParts).
func buildVars(msgs []parley.Message, opt RenderOptions, bos, eos string, now int64, thinkingKey, typedImages bool) ([]byte, error) {
	v := hfVars{AddGenerationPrompt: opt.AddGenerationPrompt, BOSToken: bos, EOSToken: eos, EnableThinking: opt.Thinking, Now: now}
	v.Messages = make([]hfMessage, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case parley.RoleSystem, parley.RoleUser, parley.RoleAssistant, parley.RoleTool:
		default:
			return nil, parley.FieldErrorf("role", "must be system, user, assistant or tool, got %q", m.Role)
		}
		hm := hfMessage{Role: string(m.Role), Content: m.Content, ReasoningContent: m.Reasoning,
			ToolCallID: m.ToolCallID, Name: m.Name}
		if typedImages && len(m.Images) > 0 {
			hm.Content = imageParts(m)
		}
		if thinkingKey {
			hm.Thinking = m.Reasoning
		}
		for _, c := range m.ToolCalls {
			args := json.RawMessage(c.Arguments)
			if !json.Valid(args) {
				args, _ = json.Marshal(c.Arguments) // a string cannot fail to marshal
			}
			hm.ToolCalls = append(hm.ToolCalls, hfToolCall{ID: c.ID, Type: "function",
				Function: hfCallFunction{Name: c.Name, Arguments: args}})
		}
		v.Messages[i] = hm
	}
	for _, t := range opt.Tools {
		params := t.Parameters
		if len(params) > 0 && !json.Valid(params) {
			return nil, parley.FieldErrorf("tools", "the parameters of %q are not valid JSON", t.Name)
		}
		v.Tools = append(v.Tools, hfTool{Type: "function",
			Function: hfToolFunction{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	return json.Marshal(v)
}

// decodeValues turns a JSON object into template values, keeping the key order of every object (the library's own
// conversion of Go maps sorts keys, which changes what tojson and items() produce).
func decodeValues(data []byte) (map[string]jinja.Value, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return nil, fmt.Errorf("decode template variables: %w", err)
	}
	if !v.IsDict() {
		return nil, fmt.Errorf("decode template variables: not an object")
	}
	dict := v.AsDict()
	out := make(map[string]jinja.Value, dict.Len())
	for _, k := range dict.Keys {
		out[k] = dict.Data[k]
	}
	return out, nil
}

// maxJSONDepth bounds the nesting of template variables (a tool schema is the deepest part, a few levels).
const maxJSONDepth = 64

func decodeValue(d *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), fmt.Errorf("nested deeper than %d levels", maxJSONDepth)
	}
	tok, err := d.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			var items []jinja.Value
			for d.More() {
				item, err := decodeValue(d, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, item)
			}
			_, err := d.Token() // ']'
			return jinja.NewList(items), err
		}
		obj := jinja.NewDict()
		dict := obj.AsDict()
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return jinja.Undefined(), err
			}
			val, err := decodeValue(d, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			dict.Set(k.(string), val)
		}
		_, err := d.Token() // '}'
		return obj, err
	case nil:
		return jinja.None(), nil
	default:
		return jinja.FromGoValue(t), nil // bool, string, json.Number
	}
}
