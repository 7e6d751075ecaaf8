package responses

// Tool calling on the Responses API: function tools and tool_choice in the
// request; function_call input items (a call the model made, resent by a
// client that keeps its own history) and function_call_output items (a
// call's result, which continues the turn); function_call output items with
// their call_id; streamed response.function_call_arguments.delta and .done
// events. A session stores a call with the assistant message that made it
// and a result as a tool message, so chained responses (previous_response_id,
// conversation) and the input_items and conversation items show them.

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// responsesTool is one of a Responses request's tools: a function, flat.
type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
}

// parseResponsesTools decodes the request's tools: its function tools; tools
// of other types are accepted and left out (see the README's list).
func parseResponsesTools(raw json.RawMessage) ([]parley.Tool, error) {
	if !apicore.IsSet(raw) {
		return nil, nil
	}
	var in []responsesTool
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, parley.FieldErrorf("tools", "must be an array of {\"type\": \"function\", \"name\": ..., \"parameters\": {...}}")
	}
	if len(in) > parley.MaxTools {
		return nil, parley.FieldErrorf("tools", "at most %d tools, got %d", parley.MaxTools, len(in))
	}
	tools := make([]parley.Tool, 0, len(in))
	for i, t := range in {
		switch t.Type {
		case "function":
			tools = append(tools, parley.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
		case "":
			return nil, parley.FieldErrorf(fmt.Sprintf("tools[%d].type", i), "is required")
		default:
			// A tool the server runs itself on OpenAI's side (web_search, file_search, code_interpreter, ...) or a
			// group of a client's tools (namespace): Parley runs none of them, so they are left out of the prompt
			// and the model is not offered them, as OpenAI leaves out a hosted tool a model does not support.
			// Codex sends web_search and namespace tools in every request.
		}
	}
	return tools, nil
}

// parseToolItem decodes a function_call or function_call_output item.
func parseToolItem(it inputItem, field string) (parley.Message, error) {
	if it.CallID == "" {
		return parley.Message{}, parley.FieldErrorf(field+".call_id", "is required")
	}
	if it.Type == "function_call" {
		if it.Name == "" {
			return parley.Message{}, parley.FieldErrorf(field+".name", "is required")
		}
		if it.Arguments != "" && !json.Valid([]byte(it.Arguments)) {
			return parley.Message{}, parley.FieldErrorf(field+".arguments", "must be JSON text")
		}
		return parley.Message{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: it.CallID, Name: it.Name, Arguments: it.Arguments}}}, nil
	}
	var out string
	if json.Unmarshal(it.Output, &out) != nil {
		// Output given as JSON rather than a string: its text is the result.
		if !apicore.IsSet(it.Output) {
			return parley.Message{}, parley.FieldErrorf(field+".output", "is required")
		}
		out = string(it.Output)
	}
	return parley.Message{Role: parley.RoleTool, Content: out, ToolCallID: it.CallID}, nil
}

// function-call item fields of messageItem; see MarshalJSON.
type toolItemFields struct {
	CallID    string
	Name      string
	Arguments string
	Output    string
}

// MarshalJSON writes a message item as a message, and a reasoning,
// function_call or function_call_output item with its own fields.
func (it messageItem) MarshalJSON() ([]byte, error) {
	switch it.Type {
	case "mcp_list_tools", "mcp_call", "mcp_approval_request":
		return json.Marshal(it.mcp)
	case "function_call":
		return json.Marshal(struct {
			Type      string `json:"type"`
			ID        string `json:"id"`
			Status    string `json:"status"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}{it.Type, it.ID, it.Status, it.tool.CallID, it.tool.Name, it.tool.Arguments})
	case "function_call_output":
		return json.Marshal(struct {
			Type   string `json:"type"`
			ID     string `json:"id"`
			Status string `json:"status"`
			CallID string `json:"call_id"`
			Output string `json:"output"`
		}{it.Type, it.ID, it.Status, it.tool.CallID, it.tool.Output})
	case "reasoning":
		return json.Marshal(reasoningItem{Type: it.Type, ID: it.ID, Status: it.Status, Summary: []struct{}{},
			Content: []reasoningText{{Type: "reasoning_text", Text: it.thought}}})
	}
	type plain messageItem // without this method
	return json.Marshal(plain(it))
}

// callItemID names call j of the message at absolute position abs of session sid.
func callItemID(sid string, abs, j int) string {
	return "fc_" + strings.TrimPrefix(session.ItemID(sid, abs), session.ItemPrefix) + "_" + strconv.Itoa(j)
}

// functionCallItem is call j of the message at abs as a function_call item.
func functionCallItem(sid string, abs, j int, c parley.ToolCall, status string) messageItem {
	return messageItem{Type: "function_call", ID: callItemID(sid, abs, j), Status: status,
		tool: toolItemFields{CallID: c.ID, Name: c.Name, Arguments: c.Arguments}}
}

// itemsOf is the message at absolute position abs of session sid as items:
// a message; an assistant message's thought as a reasoning item before the
// rest, and its calls as function_call items after its text (which is left
// out when empty); a tool message as a function_call_output item. sc (nil:
// none) are the session's server calls, shown as mcp items (mcpitems.go).
func itemsOf(sid string, abs int, m parley.Message, sc *serverCalls) []messageItem {
	if m.Role == parley.RoleTool {
		if items, ok := sc.resultItems(m); ok {
			return items
		}
		return []messageItem{{Type: "function_call_output", ID: session.ItemID(sid, abs), Status: "completed",
			tool: toolItemFields{CallID: m.ToolCallID, Output: m.Content}}}
	}
	var items []messageItem
	if m.Role == parley.RoleAssistant && m.Reasoning != "" {
		items = append(items, newReasoningItem(sid, abs+1, m.Reasoning))
	}
	if m.Content != "" || len(m.ToolCalls) == 0 {
		items = append(items, newMessageItem(session.ItemID(sid, abs), m))
	}
	for j, c := range m.ToolCalls {
		if it, ok := sc.callItem(c); ok {
			items = append(items, it)
			continue
		}
		items = append(items, functionCallItem(sid, abs, j, c, "completed"))
	}
	return items
}

// replyItems is the output of a response that ends at position end of
// session sid with reply m: its items, "incomplete" unless status is
// completed (a thought, which ended before the answer began, stays
// completed).
func replyItems(sid string, end int, status string, m parley.Message, sc *serverCalls) []messageItem {
	items := itemsOf(sid, end-1, m, sc)
	if status != session.StatusCompleted {
		for i := range items {
			if t := items[i].Type; t != "reasoning" && t != "mcp_call" && t != "mcp_approval_request" {
				items[i].Status = "incomplete"
			}
		}
	}
	return items
}
