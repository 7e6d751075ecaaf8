package responses

// Stored mcp items: a session keeps a server call in the assistant message
// that made it, marked (parley.ToolCall.Server), and its result as a tool
// message (with parley.Message.ToolError when it failed). Read back
// (GET /v1/responses/{id}, input_items, conversation items), they show as
// the items the response showed when it was made: an mcp_call with its
// output at the call, or, for a call that asked for approval, an
// mcp_approval_request at the call and the mcp_call at its result. A
// response's mcp_list_tools items are kept in its record
// (session.ResponseRecord.Listed), without their ids (the response's id
// gives them again), and show where its output showed them: before the
// calls its approvals made, else before its steps.

import (
	"encoding/json"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/toolloop"
)

// serverCalls are a session's server calls and their results, by call id.
type serverCalls struct {
	calls   map[string]parley.ToolCall
	results map[string]parley.Message
}

// newServerCalls indexes the server calls of msgs; nil when it has none.
func newServerCalls(msgs []parley.Message) *serverCalls {
	var sc *serverCalls
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if c.Server == nil {
				continue
			}
			if sc == nil {
				sc = &serverCalls{calls: map[string]parley.ToolCall{}, results: map[string]parley.Message{}}
			}
			sc.calls[c.ID] = c
		}
	}
	if sc == nil {
		return nil
	}
	for _, m := range msgs {
		if _, ok := sc.calls[m.ToolCallID]; ok && m.Role == parley.RoleTool {
			sc.results[m.ToolCallID] = m
		}
	}
	return sc
}

// storedCall is c, a stored server call, with its result (ok false: none
// yet) and the status its mcp_call shows.
func storedCall(c parley.ToolCall, result parley.Message, ok bool) (toolloop.Call, string) {
	call := toolloop.Call{ID: c.ID, Tool: toolloop.Tool{Name: c.Name, Server: c.Server.Label, Remote: c.Server.Tool,
		NeedsApproval: c.Server.Approval}, Arguments: c.Arguments}
	if !ok {
		return call, "incomplete" // the turn ended before the call did
	}
	call.Output, call.Error = result.Content, result.ToolError
	return call, callStatus(call)
}

// callItem is the item of a stored assistant message's call c; ok is
// false when c is not a server call (a function_call).
func (sc *serverCalls) callItem(c parley.ToolCall) (messageItem, bool) {
	if sc == nil || c.Server == nil {
		return messageItem{}, false
	}
	if c.Server.Approval {
		it := mcpApprovalRequestItem{Type: "mcp_approval_request", ID: approvalPrefix + c.ID, ServerLabel: c.Server.Label,
			Name: c.Server.Tool, Arguments: arguments(c.Arguments)}
		return messageItem{Type: it.Type, ID: it.ID, mcp: it}, true
	}
	res, ok := sc.results[c.ID]
	return mcpCallMessageItem(storedCall(c, res, ok)), true
}

// resultItems are the items of a stored tool message m: shown is false
// when m answers no server call (a function_call_output); no item when
// its call's mcp_call shows it.
func (sc *serverCalls) resultItems(m parley.Message) (items []messageItem, shown bool) {
	if sc == nil {
		return nil, false
	}
	c, ok := sc.calls[m.ToolCallID]
	if !ok {
		return nil, false
	}
	if !c.Server.Approval {
		return nil, true
	}
	return []messageItem{mcpCallMessageItem(storedCall(c, m, true))}, true
}

func mcpCallMessageItem(c toolloop.Call, status string) messageItem {
	it := callItem(c, status)
	return messageItem{Type: it.Type, ID: it.ID, Status: it.Status, mcp: it}
}

// storedOutput is the output of stored response rec of sess, as its
// creation showed it: its mcp_list_tools items, the mcp_call items of the calls its input approved,
// the items of the steps its server tools ran (StepsReply), then its reply.
func storedOutput(sess *session.Session, rec session.ResponseRecord) []messageItem {
	sc := newServerCalls(sess.Messages)
	out := storedListItems(rec)
	stepsAt := rec.End - 1 - rec.Steps
	if sc != nil {
		for i, m := range sess.Span(rec.Start, stepsAt) {
			for _, it := range itemsOf(sess.ID, rec.Start+i, m, sc) {
				if it.Type == "mcp_call" {
					out = append(out, it)
				}
			}
		}
	}
	if rec.Steps > 0 {
		for i, m := range sess.Span(stepsAt, rec.End-1) {
			out = append(out, itemsOf(sess.ID, stepsAt+i, m, sc)...)
		}
	}
	if reply := sess.Span(rec.End-1, rec.End); len(reply) == 1 {
		out = append(out, replyItems(sess.ID, rec.End, rec.Status, reply[0], sc)...)
	}
	return out
}

// maxStoredListBytes bounds the mcp_list_tools items a record keeps; lists
// over it are kept with their tools' names only.
const maxStoredListBytes = 64 << 10

// storedLists encodes the mcp_list_tools items of servers for a record
// (session.ResponseRecord.Listed); nil without servers.
func storedLists(servers []toolloop.ServerTools) json.RawMessage {
	if len(servers) == 0 {
		return nil
	}
	items := make([]mcpListToolsItem, len(servers))
	for i, st := range servers {
		items[i] = listToolsItem("", i, st)
		items[i].ID = ""
	}
	b, err := json.Marshal(items)
	if err == nil && len(b) <= maxStoredListBytes {
		return b
	}
	for i := range items {
		for j := range items[i].Tools {
			items[i].Tools[j].Description, items[i].Tools[j].InputSchema = "", json.RawMessage(`{"type":"object"}`)
		}
	}
	if b, err = json.Marshal(items); err != nil {
		return nil
	}
	return b
}

// storedListItems are the mcp_list_tools items rec keeps, with the ids its
// creation gave them.
func storedListItems(rec session.ResponseRecord) []messageItem {
	if len(rec.Listed) == 0 {
		return nil
	}
	var items []mcpListToolsItem
	if json.Unmarshal(rec.Listed, &items) != nil {
		return nil
	}
	out := make([]messageItem, len(items))
	for i, it := range items {
		it.Type, it.ID = "mcp_list_tools", listToolsID(rec.ID, i)
		if it.Tools == nil {
			it.Tools = []mcpListedTool{}
		}
		out[i] = messageItem{Type: it.Type, ID: it.ID, mcp: it}
	}
	return out
}

// listsAt is the absolute position of sess before whose message rec's
// mcp_list_tools items show: its first tool message that gives the result
// of a server call (a call its approvals made), else its first step (or
// its reply, without steps).
func listsAt(sess *session.Session, rec session.ResponseRecord, sc *serverCalls) int {
	stepsAt := rec.End - 1 - rec.Steps
	if sc != nil {
		for i, m := range sess.Span(rec.Start, stepsAt) {
			if _, ok := sc.calls[m.ToolCallID]; ok && m.Role == parley.RoleTool {
				return rec.Start + i
			}
		}
	}
	return stepsAt
}

// conversationLists are the mcp_list_tools items of sess's responses that
// are still whole, by the absolute position they show before.
func conversationLists(sess *session.Session, sc *serverCalls) map[int][]messageItem {
	var out map[int][]messageItem
	for _, r := range sess.Responses {
		if len(r.Listed) == 0 {
			continue
		}
		rec, ok := sess.Record(r.ID)
		if !ok {
			continue
		}
		if out == nil {
			out = map[int][]messageItem{}
		}
		at := listsAt(sess, rec, sc)
		out[at] = append(out[at], storedListItems(rec)...)
	}
	return out
}
