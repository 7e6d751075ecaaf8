package chat

// Tool calling in the hand-written template families: how each family shows
// the model its tools, writes an assistant's calls and a tool's results into
// the prompt, and how the model writes a call (its parley.ToolSyntax).
//
//   - chatml: Hermes 2 Pro / Qwen 2.5: the tools as JSON inside <tools></tools>
//     in the system turn; a call is <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>;
//     results are user turns holding <tool_response>\n...\n</tool_response>.
//   - llama3: Llama 3.1's JSON tool calling: the tools (indented JSON) open the
//     first user turn; a call is {"name": ..., "parameters": ...}; results are
//     ipython turns. With tool_choice auto a call starts at <|python_tag|>.
//   - mistral: [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS] before the last user
//     turn; a call is [TOOL_CALLS] [{"name": ..., "arguments": ...}]; results are
//     [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS].
//   - every other family (and a template Parley does not know): the generic
//     format, which is the Hermes one: the tools and instructions are added to
//     the system prompt (which families without a system role fold into the
//     first user turn), calls are <tool_call> blocks in the assistant's text,
//     results are user turns holding <tool_response> blocks.

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/pyjson"
)

// Tool syntaxes of the families.
var (
	hermesSyntax  = parley.ToolSyntax{Trigger: "<tool_call>", Open: "<tool_call>\n", Close: "\n</tool_call>"}
	llama3Syntax  = parley.ToolSyntax{Trigger: "<|python_tag|>", ArgsKey: "parameters"}
	mistralSyntax = parley.ToolSyntax{Trigger: "[TOOL_CALLS]", Open: "[TOOL_CALLS] [", Close: "]"}
	// harmonyToolSyntax: gpt-oss writes a call as a message to the function, <|start|>assistant to=functions.NAME
	// <|channel|>commentary json<|message|>{args}<|call|>, which the Splitter turns into <|call|>{"name": "NAME",
	// "arguments": {args}} in the answer's text (it never passes a harmony marker on otherwise). No Open: the
	// trigger is not the model's, so no lazy grammar waits for it; a forced call's grammar writes the call object.
	harmonyToolSyntax = parley.ToolSyntax{Trigger: harmonyCall}
)

// ToolSyntaxOf returns how a model rendered with t writes a tool call.
func ToolSyntaxOf(t Template) parley.ToolSyntax {
	if j, ok := t.(*Jinja); ok {
		return j.toolSyntax()
	}
	switch t.Name() {
	case NameLlama3:
		return llama3Syntax
	case NameMistral:
		return mistralSyntax
	}
	return hermesSyntax
}

// usesTools reports whether rendering msgs needs the tool-aware renderer.
func usesTools(msgs []parley.Message, opt RenderOptions) bool {
	if len(opt.Tools) > 0 {
		return true
	}
	for _, m := range msgs {
		if m.Role == parley.RoleTool || len(m.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// renderTools renders a conversation that has tools, calls or results: the
// family's own tool format for chatml, llama3 and mistral, the generic one
// for the rest. Each rewrites the conversation into plain system, user and
// assistant turns (plus llama3's ipython) and renders those as usual.
func (f *family) renderTools(msgs []parley.Message, opt RenderOptions) (string, error) {
	for _, m := range msgs {
		switch m.Role {
		case parley.RoleSystem, parley.RoleUser, parley.RoleAssistant, parley.RoleTool:
		default:
			return "", parley.FieldErrorf("role", "must be system, user, assistant or tool, got %q", m.Role)
		}
	}
	var out []parley.Message
	switch f.name {
	case NameLlama3:
		out = llama3Tools(msgs, opt.Tools)
	case NameMistral:
		return mistralTools(msgs, opt), nil
	default:
		out = hermesTools(msgs, opt.Tools)
	}
	var b strings.Builder
	f.render(&b, out, opt.AddGenerationPrompt)
	return b.String(), nil
}

// hermesPreamble is Qwen 2.5's tool instructions, around the tools' JSON.
const (
	hermesToolsHead = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
	hermesToolsTail = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within " +
		"<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
)

// hermesTools rewrites msgs in the Hermes/Qwen format: the tools in the
// (first) system message, calls as <tool_call> blocks, consecutive results
// as one user turn of <tool_response> blocks.
func hermesTools(msgs []parley.Message, tools []parley.Tool) []parley.Message {
	var out []parley.Message
	if len(tools) > 0 {
		var b strings.Builder
		if len(msgs) > 0 && msgs[0].Role == parley.RoleSystem {
			b.WriteString(msgs[0].Content + "\n\n")
			msgs = msgs[1:]
		}
		b.WriteString(hermesToolsHead)
		for _, t := range tools {
			b.WriteString("\n" + toolJSON(t, 0))
		}
		b.WriteString(hermesToolsTail)
		out = append(out, parley.Message{Role: parley.RoleSystem, Content: b.String()})
	}
	for i, m := range msgs {
		switch {
		case m.Role == parley.RoleAssistant && len(m.ToolCalls) > 0:
			var b strings.Builder
			b.WriteString(m.Content)
			for _, c := range m.ToolCalls {
				if b.Len() > 0 {
					b.WriteString("\n")
				}
				b.WriteString("<tool_call>\n" + callJSON(c, "arguments") + "\n</tool_call>")
			}
			out = append(out, parley.Message{Role: parley.RoleAssistant, Content: b.String()})
		case m.Role == parley.RoleTool:
			block := "<tool_response>\n" + m.Content + "\n</tool_response>"
			if i > 0 && msgs[i-1].Role == parley.RoleTool {
				out[len(out)-1].Content += "\n" + block
			} else {
				out = append(out, parley.Message{Role: parley.RoleUser, Content: block})
			}
		default:
			out = append(out, m)
		}
	}
	return out
}

// llama3Tools rewrites msgs in Llama 3.1's format (tools in the first user
// message, calls as the assistant's JSON, results as ipython turns).
func llama3Tools(msgs []parley.Message, tools []parley.Tool) []parley.Message {
	var out []parley.Message
	first := len(tools) > 0
	for _, m := range msgs {
		switch {
		case m.Role == parley.RoleUser && first:
			first = false
			var b strings.Builder
			b.WriteString("Given the following functions, please respond with a JSON for a function call with its proper arguments " +
				"that best answers the given prompt.\n\n" +
				`Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.` +
				"Do not use variables.\n\n")
			for _, t := range tools {
				b.WriteString(toolJSON(t, 4) + "\n\n")
			}
			b.WriteString(pyStrip(m.Content))
			out = append(out, parley.Message{Role: parley.RoleUser, Content: b.String()})
		case m.Role == parley.RoleAssistant && len(m.ToolCalls) > 0:
			// Llama 3.1 makes one call a turn; later ones follow as turns of their own.
			for _, c := range m.ToolCalls {
				out = append(out, parley.Message{Role: parley.RoleAssistant, Content: callJSON(c, "parameters")})
			}
		case m.Role == parley.RoleTool:
			// The official template writes a string result with tojson.
			out = append(out, parley.Message{Role: "ipython", Content: pyjson.String(m.Content)})
		default:
			out = append(out, m)
		}
	}
	return out
}

// mistralTools renders msgs in Mistral's v0.3 tool format on Parley's
// mistral family ([INST] user [/INST]reply</s>).
func mistralTools(msgs []parley.Message, opt RenderOptions) string {
	sys, hasSys := systemText(msgs)
	lastUser := -1
	for i, m := range msgs {
		if m.Role == parley.RoleUser {
			lastUser = i
		}
	}
	var b strings.Builder
	for i, m := range msgs {
		switch m.Role {
		case parley.RoleUser:
			if i == lastUser && len(opt.Tools) > 0 {
				b.WriteString("[AVAILABLE_TOOLS] [")
				for j, t := range opt.Tools {
					if j > 0 {
						b.WriteString(", ")
					}
					b.WriteString(toolJSON(t, 0))
				}
				b.WriteString("][/AVAILABLE_TOOLS]")
			}
			content := m.Content
			if hasSys {
				content, hasSys = sys+"\n\n"+content, false
			}
			b.WriteString("[INST] " + content + " [/INST]")
		case parley.RoleAssistant:
			if len(m.ToolCalls) == 0 {
				b.WriteString(m.Content + "</s>")
				continue
			}
			b.WriteString("[TOOL_CALLS] [")
			for j, c := range m.ToolCalls {
				if j > 0 {
					b.WriteString(", ")
				}
				call := callJSON(c, "arguments")
				b.WriteString(call[:len(call)-1] + `, "id": ` + pyjson.String(c.ID) + "}")
			}
			b.WriteString("]</s>")
		case parley.RoleTool:
			b.WriteString(`[TOOL_RESULTS] {"content": ` + pyjson.String(m.Content) + `, "call_id": ` + pyjson.String(m.ToolCallID) + "}[/TOOL_RESULTS]")
		}
	}
	return b.String()
}

// toolJSON is a tool as Hugging Face passes it to a template
// ({"type": "function", "function": {...}}), written by tojson.
func toolJSON(t parley.Tool, indent int) string {
	var b bytes.Buffer
	b.WriteString(`{"type":"function","function":{"name":`)
	name, _ := json.Marshal(t.Name)
	b.Write(name)
	if t.Description != "" {
		d, _ := json.Marshal(t.Description)
		b.WriteString(`,"description":`)
		b.Write(d)
	}
	if len(t.Parameters) > 0 {
		b.WriteString(`,"parameters":`)
		b.Write(t.Parameters)
	}
	b.WriteString("}}")
	return pyjson.Text(b.Bytes(), pyjson.Indented(indent))
}

// callJSON is a call as the Hermes and Llama templates write it:
// {"name": "...", key: <arguments, by tojson>}.
func callJSON(c parley.ToolCall, key string) string {
	args := c.Arguments
	if strings.TrimSpace(args) == "" {
		args = "{}"
	}
	return `{"name": ` + pyjson.String(c.Name) + `, "` + key + `": ` + pyjson.Text([]byte(args), pyjson.Compact) + "}"
}

// toolSetup prepares a reply to p for tools: it sets p's ToolSyntax from the
// template (converting the tools' call grammar for it, without validating p
// again when the edge has: see parley.Params.SetToolSyntax), and returns the render options, the reply's tool-call splitter (nil
// when it may make no call) and extra stop strings (tool_choice none stops
// at the family's trigger: the model may not call).
func toolSetup(tmpl Template, p *parley.Params) (RenderOptions, *toolStream, []string, error) {
	opt := Gen
	opt.Thinking = p.Think
	if len(p.Tools) == 0 {
		return opt, nil, nil, nil
	}
	if err := p.SetToolSyntax(ToolSyntaxOf(tmpl)); err != nil {
		return opt, nil, nil, err
	}
	if !p.ToolsActive() {
		return opt, nil, []string{p.ToolSyntax.Trigger}, nil
	}
	opt.Tools = p.Tools
	return opt, newToolStream(p.ToolSyntax, p.Tools, p.ToolsForced()), nil, nil
}

// toolsFinal sets the final event's calls; a reply that made calls and
// ended on its own finishes with FinishToolCalls.
func toolsFinal(final parley.Event, calls []parley.ToolCall) parley.Event {
	if len(calls) == 0 {
		return final
	}
	final.ToolCalls = calls
	if final.Finish == parley.FinishEOS || final.Finish == parley.FinishStop {
		final.Finish = parley.FinishToolCalls
	}
	return final
}
