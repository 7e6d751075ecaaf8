package responses

// The hosted mcp tool on the Responses API: {"type": "mcp", "server_label":
// ..., "allowed_tools": ..., "require_approval": ...} names a server the
// operator configured (--mcp-config) that the request's user may use; its
// tools run on the server (toolloop, through servertools). A response shows
// an mcp_list_tools item per server, an mcp_call item per call (with its
// output or error), and an mcp_approval_request item for a call that waits
// for the user; a later request (previous_response_id or conversation)
// answers it with an mcp_approval_response input item, and the turn goes on
// from the call. Streamed, the items come with OpenAI's events:
// response.mcp_list_tools.in_progress/.completed/.failed,
// response.mcp_call_arguments.delta/.done,
// response.mcp_call.in_progress/.completed/.failed.
//
// server_url, connector_id, headers and authorization are ignored: the
// label alone names the server, and Parley dials only servers the operator
// configured, with the operator's secrets.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/servertools"
)

// ID prefixes of the mcp items. An approval request's id is its call's id
// after approvalPrefix, so its answer finds the call again.
const (
	listToolsPrefix = "mcpl_"
	mcpCallPrefix   = "mcp_"
	approvalPrefix  = "mcpr_"
)

// mcpRequest is a request's mcp tools and its answers to approval requests.
type mcpRequest struct {
	specs     []toolloop.MCPSpec
	approvals []mcpApproval
	// set by prepareMCP
	tools *servertools.Responder
	made  []toolloop.Call // the approved calls made before the turn, and the declined ones (Error set)
}

// mcpApproval is one mcp_approval_response input item.
type mcpApproval struct {
	callID  string
	approve bool
	field   string
}

// mcpItem reports whether an input item's type is one of the mcp items:
// mcp_approval_response (an answer), or mcp_list_tools, mcp_call and
// mcp_approval_request (output items a client that keeps its own history
// sends back; the session holds what they show).
func mcpItem(typ string) bool {
	switch typ {
	case "mcp_approval_response", "mcp_list_tools", "mcp_call", "mcp_approval_request":
		return true
	}
	return false
}

// mcpToolSpec is a request's {"type": "mcp"} tool.
type mcpToolSpec struct {
	Type            string          `json:"type"`
	ServerLabel     string          `json:"server_label"`
	AllowedTools    json.RawMessage `json:"allowed_tools"`
	RequireApproval json.RawMessage `json:"require_approval"`
}

// toolNames is OpenAI's filter object: {"tool_names": [...]}.
type toolNames struct {
	ToolNames []string `json:"tool_names"`
}

// parseMCPRequest reads the request's mcp tools and mcp_approval_response
// input items; nil when it has neither.
func parseMCPRequest(tools, input json.RawMessage) (*mcpRequest, error) {
	var out mcpRequest
	if apicore.IsSet(tools) {
		var specs []mcpToolSpec
		if err := json.Unmarshal(tools, &specs); err == nil { // a malformed array is parseResponsesTools' error
			for i, t := range specs {
				if t.Type != "mcp" {
					continue
				}
				sp, err := parseMCPSpec(t, fmt.Sprintf("tools[%d]", i))
				if err != nil {
					return nil, err
				}
				out.specs = append(out.specs, sp)
			}
		}
	}
	if raw := bytes.TrimSpace(input); len(raw) > 0 && raw[0] == '[' {
		var items []inputItem
		if err := json.Unmarshal(raw, &items); err == nil { // a malformed array is parseInput's error
			for i, it := range items {
				if it.Type != "mcp_approval_response" {
					continue
				}
				f := fmt.Sprintf("input[%d]", i)
				id, ok := strings.CutPrefix(it.ApprovalRequestID, approvalPrefix)
				if !ok || id == "" {
					return nil, parley.FieldErrorf(f+".approval_request_id", "must name an mcp_approval_request of this conversation, got %q", it.ApprovalRequestID)
				}
				if it.Approve == nil {
					return nil, parley.FieldErrorf(f+".approve", "is required")
				}
				out.approvals = append(out.approvals, mcpApproval{callID: id, approve: *it.Approve, field: f})
			}
		}
	}
	if len(out.specs) == 0 && len(out.approvals) == 0 {
		return nil, nil
	}
	if len(out.specs) == 0 {
		return nil, parley.FieldErrorf("tools", "an mcp_approval_response needs the mcp tool of its server in the request's tools")
	}
	return &out, nil
}

// parseMCPSpec reads one mcp tool (field names it).
func parseMCPSpec(t mcpToolSpec, field string) (toolloop.MCPSpec, error) {
	sp := toolloop.MCPSpec{ServerLabel: t.ServerLabel}
	if t.ServerLabel == "" {
		return sp, parley.FieldErrorf(field+".server_label", "is required")
	}
	if apicore.IsSet(t.AllowedTools) {
		if json.Unmarshal(t.AllowedTools, &sp.AllowedTools) != nil {
			var f toolNames
			if json.Unmarshal(t.AllowedTools, &f) != nil {
				return sp, parley.FieldErrorf(field+".allowed_tools", "must be an array of tool names or {\"tool_names\": [...]}")
			}
			sp.AllowedTools = f.ToolNames
		}
		if sp.AllowedTools == nil {
			sp.AllowedTools = []string{} // an empty list allows no tool
		}
	}
	if apicore.IsSet(t.RequireApproval) {
		var mode string
		if json.Unmarshal(t.RequireApproval, &mode) == nil {
			if mode != toolloop.ApprovalAlways && mode != toolloop.ApprovalNever {
				return sp, parley.FieldErrorf(field+".require_approval", "must be always, never or {\"always\": {\"tool_names\": [...]}, \"never\": {...}}, got %q", mode)
			}
			sp.RequireApproval.Mode = mode
		} else {
			var f struct {
				Always *toolNames `json:"always"`
				Never  *toolNames `json:"never"`
			}
			if json.Unmarshal(t.RequireApproval, &f) != nil {
				return sp, parley.FieldErrorf(field+".require_approval", "must be always, never or {\"always\": {\"tool_names\": [...]}, \"never\": {...}}")
			}
			if f.Always != nil {
				sp.RequireApproval.Always = f.Always.ToolNames
			}
			if f.Never != nil {
				sp.RequireApproval.Never = f.Never.ToolNames
			}
		}
	}
	return sp, nil
}

// prepareMCP lists the request's server tools for its caller's user, makes the
// calls its approval answers approve (their results, and a declined call's
// refusal, become the turn's first input messages), and sets the turn to
// reply through the tool loop. A server the user may not use is refused
// here, naming it.
func (s *API) prepareMCP(ctx context.Context, pr *parsedResponse) error {
	m := pr.mcp
	if m == nil {
		return nil
	}
	if pr.warmup {
		return parley.FieldErrorf("generate", "a warm-up cannot have mcp tools")
	}
	tools, err := servertools.Build(ctx, s.core, pr.facts.Caller.User, toolloop.Selection{Servers: m.specs}, pr.req.Params.Tools)
	if err != nil {
		return err
	}
	m.tools = tools
	pr.req.Listed = storedLists(tools.Tools().Servers())
	stateless := pr.req.Previous == "" && pr.req.Conversation == ""
	if stateless {
		nameServerCalls(pr.req.Input, tools.Tools())
	}
	if len(m.approvals) > 0 {
		results, err := s.answerApprovals(ctx, pr)
		if err != nil {
			return err
		}
		if stateless {
			pr.req.Input = afterCalls(pr.req.Input, results)
		} else {
			pr.req.Input = append(results, pr.req.Input...)
		}
	}
	pr.req.Responder = tools
	return nil
}

// answerApprovals finds each answered call in the conversation the request
// continues, or, continuing none, in its input (the mcp_approval_request
// items a client sends back, as OpenAI's store: false asks), makes the
// approved ones and returns the tool messages of all of them, in the order
// answered. A call to a tool that the request's mcp tools do not enable for
// its user is refused, wherever the call came from.
func (s *API) answerApprovals(ctx context.Context, pr *parsedResponse) ([]parley.Message, error) {
	var history []parley.Message
	switch {
	case pr.req.Previous != "":
		_, sess, err := s.convs.GetResponse(ctx, pr.facts.Caller, pr.req.Previous)
		if err != nil {
			return nil, err
		}
		history = sess.Messages
	case pr.req.Conversation != "":
		sid, ok := session.ConversationSession(pr.req.Conversation)
		if !ok {
			return nil, parley.Errorf(parley.ENotFound, "no such conversation")
		}
		sess, err := s.convs.Conversation(ctx, pr.facts.Caller, sid)
		if err != nil {
			return nil, err
		}
		history = sess.Messages
	default:
		history = pr.req.Input
	}
	m := pr.mcp
	ts := m.tools.Tools()
	var out []parley.Message
	seen := map[string]bool{}
	for _, a := range m.approvals {
		c, answered, ok := servertools.FindCall(history, a.callID)
		var t toolloop.Tool
		known := false
		if c.Server != nil {
			// By the server and tool the call names: a name alone may be
			// another server's tool in this request.
			t, known = ts.Find(c.Server.Label, c.Server.Tool)
		}
		switch {
		case !ok && pr.req.Previous == "" && pr.req.Conversation == "":
			return nil, parley.FieldErrorf(a.field+".approval_request_id", "names no mcp_approval_request of the input (without previous_response_id or conversation, the input holds the items of the response that asked)")
		case !ok:
			return nil, parley.FieldErrorf(a.field+".approval_request_id", "names no mcp_approval_request of this conversation")
		case c.Server == nil:
			return nil, parley.FieldErrorf(a.field+".approval_request_id", "names a call to a client's function, not an mcp_approval_request")
		case answered || seen[a.callID]:
			return nil, parley.FieldErrorf(a.field+".approval_request_id", "was answered already")
		case !known:
			return nil, parley.FieldErrorf(a.field+".approval_request_id", "names a call to a tool this request's mcp tools do not enable (%s of server %q)", c.Server.Tool, c.Server.Label)
		}
		seen[a.callID] = true
		call := toolloop.Call{ID: c.ID, Tool: t, Arguments: c.Arguments, Output: toolloop.Declined, Error: toolloop.DeclinedError}
		if a.approve {
			call = toolloop.Invoke(ctx, m.tools.Host(), m.tools.Tools().User(), t, c, m.tools.Log())
			if err := ctx.Err(); err != nil {
				return nil, context.Cause(ctx)
			}
		}
		m.made = append(m.made, call)
		out = append(out, toolloop.ResultMessage(call))
	}
	return out, nil
}

// mcpInputMessages are the messages a session stores for an mcp_call or
// mcp_approval_request item a client sends back in the input of a request
// that continues no stored history (field names it; msgs are the input's
// messages before it): the assistant's call, marked as a server's
// (parley.ToolCall.Server, named by its remote name until nameServerCalls),
// and, for an mcp_call with a result, the tool message of its result. An
// mcp_call whose call an mcp_approval_request of msgs made gives the result
// alone; one without a result (its turn ended first) gives nothing, so
// that no call is made again unasked. Other mcp items give nothing.
func mcpInputMessages(it inputItem, field string, msgs []parley.Message) ([]parley.Message, error) {
	prefix := mcpCallPrefix
	switch it.Type {
	case "mcp_call":
	case "mcp_approval_request":
		prefix = approvalPrefix
	default:
		return nil, nil
	}
	id, _ := strings.CutPrefix(it.ID, prefix) // an id Parley did not give is the call's id as it is
	if id == "" {
		return nil, parley.FieldErrorf(field+".id", "is required (the id of the %s as the response gave it)", it.Type)
	}
	if it.ServerLabel == "" || it.Name == "" {
		return nil, parley.FieldErrorf(field, "an %s needs its server_label and name", it.Type)
	}
	if strings.TrimSpace(it.Arguments) != "" && !json.Valid([]byte(it.Arguments)) {
		return nil, parley.FieldErrorf(field+".arguments", "must be JSON text")
	}
	call := parley.ToolCall{ID: id, Name: it.Name, Arguments: it.Arguments,
		Server: &parley.ServerCall{Label: it.ServerLabel, Tool: it.Name, Approval: it.Type == "mcp_approval_request" || it.ApprovalRequestID != ""}}
	if it.Type == "mcp_approval_request" {
		return []parley.Message{{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{call}}}, nil
	}
	var out, errText string
	if apicore.IsSet(it.Output) && json.Unmarshal(it.Output, &out) != nil {
		return nil, parley.FieldErrorf(field+".output", "must be a string or null")
	}
	if it.Error != nil {
		errText = *it.Error
		if out == "" {
			out = "error: " + errText
		}
	}
	if !apicore.IsSet(it.Output) && it.Error == nil {
		return nil, nil
	}
	result := parley.Message{Role: parley.RoleTool, ToolCallID: id, Name: it.Name, Content: out, ToolError: errText}
	if _, _, made := servertools.FindCall(msgs, id); made {
		return []parley.Message{result}, nil
	}
	return []parley.Message{{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{call}}, result}, nil
}

// nameServerCalls names each server call of msgs (from mcp items of the
// input) and its result as the model knows the tool in this request, when
// the request's tools (ts) enable it.
func nameServerCalls(msgs []parley.Message, ts *toolloop.Toolset) {
	names := map[string]string{}
	for i := range msgs {
		for j, c := range msgs[i].ToolCalls {
			if c.Server == nil {
				continue
			}
			if t, ok := ts.Find(c.Server.Label, c.Server.Tool); ok {
				msgs[i].ToolCalls[j].Name, names[c.ID] = t.Name, t.Name
			}
		}
		if n, ok := names[msgs[i].ToolCallID]; ok && msgs[i].Role == parley.RoleTool {
			msgs[i].Name = n
		}
	}
}

// afterCalls is msgs with each result placed after the message that made
// its call and the tool messages that follow that message.
func afterCalls(msgs, results []parley.Message) []parley.Message {
	made := map[string]int{} // call id -> index of the message that made it
	for i, m := range msgs {
		for _, c := range m.ToolCalls {
			made[c.ID] = i
		}
	}
	at := map[int][]parley.Message{}
	for _, r := range results {
		i := made[r.ToolCallID] // answerApprovals found every call in msgs
		at[i] = append(at[i], r)
	}
	out := make([]parley.Message, 0, len(msgs)+len(results))
	var due []parley.Message
	for i, m := range msgs {
		if m.Role != parley.RoleTool {
			out, due = append(out, due...), nil
		}
		out = append(out, m)
		due = append(due, at[i]...)
	}
	return append(out, due...)
}

// Wire shapes of the mcp items.

type mcpListedTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
	Annotations *struct{}       `json:"annotations"` // always null
}

type mcpListToolsItem struct {
	Type        string          `json:"type"` // mcp_list_tools
	ID          string          `json:"id"`   // stored without it: listToolsID gives it again
	ServerLabel string          `json:"server_label"`
	Tools       []mcpListedTool `json:"tools"`
	Error       *string         `json:"error"`
}

type mcpCallItem struct {
	Type              string  `json:"type"` // mcp_call
	ID                string  `json:"id"`
	Status            string  `json:"status"` // in_progress, completed, failed
	ServerLabel       string  `json:"server_label"`
	Name              string  `json:"name"`
	Arguments         string  `json:"arguments"`
	Output            *string `json:"output"`
	Error             *string `json:"error"`
	ApprovalRequestID *string `json:"approval_request_id"`
}

type mcpApprovalRequestItem struct {
	Type        string `json:"type"` // mcp_approval_request
	ID          string `json:"id"`
	ServerLabel string `json:"server_label"`
	Name        string `json:"name"`
	Arguments   string `json:"arguments"`
}

// listToolsID is the id of response respID's mcp_list_tools item of its
// i-th server.
func listToolsID(respID string, i int) string {
	return fmt.Sprintf("%s%s_%d", listToolsPrefix, strings.TrimPrefix(respID, session.ResponsePrefix), i)
}

func listToolsItem(respID string, i int, st toolloop.ServerTools) mcpListToolsItem {
	it := mcpListToolsItem{Type: "mcp_list_tools", ID: listToolsID(respID, i), ServerLabel: st.Label, Tools: []mcpListedTool{}}
	for _, t := range st.Tools {
		schema := t.Parameters
		if !apicore.IsSet(schema) {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		it.Tools = append(it.Tools, mcpListedTool{Name: t.Remote, Description: t.Description, InputSchema: schema})
	}
	if st.Err != nil {
		msg := parley.ErrorMessage(st.Err)
		it.Error = &msg
	}
	return it
}

// arguments is a call's arguments as the items show them: a JSON object.
func arguments(s string) string {
	if strings.TrimSpace(s) == "" {
		return "{}"
	}
	return s
}

func callItem(c toolloop.Call, status string) mcpCallItem {
	it := mcpCallItem{Type: "mcp_call", ID: mcpCallPrefix + c.ID, Status: status, ServerLabel: c.Tool.Server, Name: c.Tool.Remote,
		Arguments: arguments(c.Arguments)}
	if c.Tool.NeedsApproval {
		id := approvalPrefix + c.ID
		it.ApprovalRequestID = &id
	}
	switch status {
	case "completed":
		out := c.Output
		it.Output = &out
	case "failed":
		e := c.Error
		it.Error = &e
	}
	return it
}

func callStatus(c toolloop.Call) string {
	if c.Error != "" {
		return "failed"
	}
	return "completed"
}

// mcpOutput builds an mcp turn's output items from its events, and sends
// them as stream events when es is set.
type mcpOutput struct {
	es    *eventStream // nil: not streamed
	sid   string
	pos   int   // the absolute position of the message the loop adds next
	out   []any // the output items so far
	calls map[string]int
	// the current step's reasoning item: open from its first thought token
	// until its answer's text, a call, or its end
	rsOpen  bool
	rsIdx   int
	thought strings.Builder
	// the open message item of the current step
	msgOpen bool
	msgIdx  int
	msg     messageItem
	text    strings.Builder
	// the client's function calls of the current step, by index
	fc map[int]int // call index -> output index
}

func (o *mcpOutput) send(typ string, fields map[string]any) error {
	if o.es == nil {
		return nil
	}
	return o.es.send(typ, fields)
}

// add appends item and sends output_item.added (with shown, its state then).
func (o *mcpOutput) add(item, shown any) (int, error) {
	o.out = append(o.out, item)
	i := len(o.out) - 1
	return i, o.send("response.output_item.added", map[string]any{"output_index": i, "item": shown})
}

func (o *mcpOutput) done(i int) error {
	return o.send("response.output_item.done", map[string]any{"output_index": i, "item": o.out[i]})
}

// listTools adds a server's mcp_list_tools item.
func (o *mcpOutput) listTools(it mcpListToolsItem) error {
	shown := it
	shown.Tools, shown.Error = []mcpListedTool{}, nil
	i, err := o.add(it, shown)
	if err != nil {
		return err
	}
	at := map[string]any{"item_id": it.ID, "output_index": i}
	end := "response.mcp_list_tools.completed"
	if it.Error != nil {
		end = "response.mcp_list_tools.failed"
	}
	return steps(
		func() error { return o.send("response.mcp_list_tools.in_progress", clone(at)) },
		func() error { return o.send(end, clone(at)) },
		func() error { return o.done(i) },
	)
}

func clone(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// callStarted adds a server call's mcp_call item, in progress.
func (o *mcpOutput) callStarted(c toolloop.Call) error {
	it := callItem(c, "in_progress")
	i, err := o.add(it, it)
	if err != nil {
		return err
	}
	if o.calls == nil {
		o.calls = map[string]int{}
	}
	o.calls[c.ID] = i
	at := func(m map[string]any) map[string]any { m["item_id"], m["output_index"] = it.ID, i; return m }
	return steps(
		func() error {
			return o.send("response.mcp_call_arguments.delta", at(map[string]any{"delta": it.Arguments}))
		},
		func() error {
			return o.send("response.mcp_call_arguments.done", at(map[string]any{"arguments": it.Arguments}))
		},
		func() error { return o.send("response.mcp_call.in_progress", at(map[string]any{})) },
	)
}

// callEnded completes a server call's item with its result.
func (o *mcpOutput) callEnded(c toolloop.Call) error {
	i, ok := o.calls[c.ID]
	if !ok {
		if err := o.callStarted(c); err != nil {
			return err
		}
		i = o.calls[c.ID]
	}
	status := callStatus(c)
	it := callItem(c, status)
	o.out[i] = it
	return steps(
		func() error {
			return o.send("response.mcp_call."+status, map[string]any{"item_id": it.ID, "output_index": i})
		},
		func() error { return o.done(i) },
	)
}

// approval adds an mcp_approval_request item.
func (o *mcpOutput) approval(a toolloop.ApprovalRequest) error {
	it := mcpApprovalRequestItem{Type: "mcp_approval_request", ID: approvalPrefix + a.ID, ServerLabel: a.Tool.Server,
		Name: a.Tool.Remote, Arguments: arguments(a.Arguments)}
	i, err := o.add(it, it)
	if err != nil {
		return err
	}
	return o.done(i)
}

// thinking streams a thought token of the current step into its reasoning
// item, which comes before the step's other items as a turn without tools
// has it (and with the id the stored step shows: itemsOf).
func (o *mcpOutput) thinking(text string) error {
	if !o.rsOpen {
		o.rsOpen = true
		it := reasoningItem{Type: "reasoning", ID: reasoningItemID(o.sid, o.pos+1), Status: "in_progress", Summary: []struct{}{}, Content: []reasoningText{}}
		var err error
		if o.rsIdx, err = o.add(newReasoningItem(o.sid, o.pos+1, ""), it); err != nil {
			return err
		}
	}
	o.thought.WriteString(text)
	return o.send("response.reasoning_text.delta", atPart(reasoningItemID(o.sid, o.pos+1), o.rsIdx, map[string]any{"delta": text}))
}

// thoughtDone ends the current step's reasoning item, if open.
func (o *mcpOutput) thoughtDone() error {
	if !o.rsOpen {
		return nil
	}
	o.rsOpen = false
	text := o.thought.String()
	o.thought.Reset()
	it := newReasoningItem(o.sid, o.pos+1, text)
	o.out[o.rsIdx] = it
	return steps(
		func() error {
			return o.send("response.reasoning_text.done", atPart(it.ID, o.rsIdx, map[string]any{"text": text}))
		},
		func() error { return o.done(o.rsIdx) },
	)
}

// token streams a model token of the current step: its thought into the
// step's reasoning item, its text into the step's message item, a client
// call's delta into its function_call item.
func (o *mcpOutput) token(ev parley.Event) error {
	if r := ev.Token.Reasoning; r != "" && !o.msgOpen && len(o.fc) == 0 {
		if err := o.thinking(r); err != nil {
			return err
		}
	}
	if ev.Token.Text != "" || ev.ToolCall != nil {
		if err := o.thoughtDone(); err != nil {
			return err
		}
	}
	if t := ev.Token.Text; t != "" {
		if !o.msgOpen {
			o.msgOpen = true
			o.msg = newMessageItem(session.ItemID(o.sid, o.pos), parley.Message{Role: parley.RoleAssistant})
			shown := o.msg
			shown.Status, shown.Content = "in_progress", []outputText{}
			var err error
			if o.msgIdx, err = o.add(o.msg, shown); err != nil {
				return err
			}
			if err := o.send("response.content_part.added", atPart(o.msg.ID, o.msgIdx, map[string]any{"part": newPart("output_text", "")})); err != nil {
				return err
			}
		}
		o.text.WriteString(t)
		if o.es != nil {
			delta := deltaEvent{Delta: t, ItemID: o.msg.ID, OutputIndex: o.msgIdx, SequenceNumber: o.es.seq, Type: "response.output_text.delta"}
			if err := o.es.put(delta.Type, delta); err != nil {
				return err
			}
		}
	}
	if d := ev.ToolCall; d != nil {
		if o.fc == nil {
			o.fc = map[int]int{}
		}
		i, ok := o.fc[d.Index]
		if d.ID != "" && !ok {
			it := functionCallItem(o.sid, o.pos, d.Index, parley.ToolCall{ID: d.ID, Name: d.Name}, "in_progress")
			var err error
			if i, err = o.add(it, it); err != nil {
				return err
			}
			o.fc[d.Index], ok = i, true
		}
		if ok && d.Arguments != "" {
			it := o.out[i].(messageItem)
			it.tool.Arguments += d.Arguments
			o.out[i] = it
			if err := o.send("response.function_call_arguments.delta", map[string]any{"item_id": it.ID, "output_index": i, "delta": d.Arguments}); err != nil {
				return err
			}
		}
	}
	return nil
}

// replyDone ends the current step's items: its message and the client's
// calls (final, from the reply's final event), with status for them all.
func (o *mcpOutput) replyDone(final parley.Event, status string) error {
	if err := o.thoughtDone(); err != nil {
		return err
	}
	if o.msgOpen {
		o.msgOpen = false
		text := o.text.String()
		o.text.Reset()
		it := o.msg
		it.Content = []outputText{newPart("output_text", text)}
		if status != session.StatusCompleted {
			it.Status = "incomplete"
		}
		o.out[o.msgIdx] = it
		i := o.msgIdx
		err := steps(
			func() error {
				return o.send("response.output_text.done", atPart(it.ID, i, map[string]any{"text": text, "logprobs": []any{}}))
			},
			func() error {
				return o.send("response.content_part.done", atPart(it.ID, i, map[string]any{"part": it.Content[0]}))
			},
			func() error { return o.done(i) },
		)
		if err != nil {
			return err
		}
	}
	for _, idx := range slices.Sorted(maps.Keys(o.fc)) {
		i := o.fc[idx]
		it := o.out[i].(messageItem)
		it.Status = "incomplete"
		if idx < len(final.ToolCalls) {
			it.tool.Arguments, it.Status = final.ToolCalls[idx].Arguments, "completed"
		}
		o.out[i] = it
		err := steps(
			func() error {
				return o.send("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "name": it.tool.Name, "arguments": it.tool.Arguments})
			},
			func() error { return o.done(i) },
		)
		if err != nil {
			return err
		}
	}
	o.fc = nil
	o.pos++ // the step's assistant message
	return nil
}

// event handles one event of the turn; the final event is the caller's.
func (o *mcpOutput) event(ev parley.Event) error {
	le, ok := servertools.Aside(ev)
	if !ok {
		return o.token(ev)
	}
	switch le.Kind {
	case toolloop.EventToken:
		if le.Server {
			return nil // a server call is shown whole when it starts
		}
		return o.token(ev)
	case toolloop.EventReplyDone:
		status := session.StatusCompleted
		if le.Model.Finish == parley.FinishLength || le.Model.Finish == parley.FinishCancelled {
			status = session.StatusIncomplete
		}
		return o.replyDone(le.Model, status)
	case toolloop.EventCall:
		return o.callStarted(*le.Call)
	case toolloop.EventResult:
		o.pos++ // the call's tool message
		return o.callEnded(*le.Call)
	case toolloop.EventApproval:
		return o.approval(*le.Approval)
	}
	return nil
}

// start sends the items that come before the turn's events: each server's
// tools, then the calls the request's approvals made.
func (o *mcpOutput) start(respID string, m *mcpRequest) error {
	for i, st := range m.tools.Tools().Servers() {
		if err := o.listTools(listToolsItem(respID, i, st)); err != nil {
			return err
		}
	}
	for _, c := range m.made {
		if err := o.callEnded(c); err != nil {
			return err
		}
	}
	return nil
}

// respondMCP answers an mcp turn, streamed through emit or (emit nil) as
// one response object.
func (s *API) respondMCP(ctx context.Context, cancel context.CancelFunc, resp *session.Response, pr *parsedResponse, emit func(typ string, b []byte) error) (*responseObject, error) {
	var es *eventStream
	if emit != nil {
		es = &eventStream{emit: emit}
	}
	meter := s.core.Meter(pr.facts.Model)
	drain := func(err error) (*responseObject, error) {
		cancel()
		for ev := range resp.Events() {
			meter.Observe(ev)
		}
		return nil, err
	}
	// The turn's input message is at End-2 as the record was made; the
	// loop's messages follow it.
	o := &mcpOutput{es: es, sid: resp.SessionID(), pos: resp.Record.End - 1}
	if es != nil {
		initial := s.newResponseObject(resp.Record, resp.SessionID(), resp.Stored, resp.Model)
		initial.Status = "in_progress"
		pr.echo(initial, resp.SessionID())
		if err := steps(
			func() error { return es.send("response.created", map[string]any{"response": initial}) },
			func() error { return es.send("response.in_progress", map[string]any{"response": initial}) },
		); err != nil {
			return drain(err)
		}
	}
	if err := o.start(resp.Record.ID, pr.mcp); err != nil {
		return drain(err)
	}
	var final parley.Event
	for ev := range resp.Events() {
		meter.Observe(ev)
		if ev.Done {
			final = ev
			continue
		}
		if err := o.event(ev); err != nil {
			return drain(err)
		}
	}
	apicore.ReplyLog(s.core.Log.With(zap.String("route", "responses-mcp")), final)
	if final.Finish == parley.FinishError || (final.Finish == parley.FinishCancelled && ctx.Err() == nil) {
		err := pr.renameSent(apicore.ReplyError(final))
		if es != nil {
			return nil, s.streamFailed(es, resp, err)
		}
		return nil, err
	}
	done := s.newResponseObject(resp.Final(), resp.SessionID(), resp.Stored, resp.Model)
	done.Output = append(done.Output, o.out...)
	pr.echo(done, resp.SessionID())
	setUsage(done, resp.Final())
	if es != nil {
		typ := "response.completed"
		if done.Status == session.StatusIncomplete {
			typ = "response.incomplete"
		}
		return done, es.send(typ, map[string]any{"response": done})
	}
	return done, nil
}

// answerMCP answers an HTTP request's mcp turn: server-sent events when it
// streams, else the response object.
func (s *API) answerMCP(c echo.Context, ctx context.Context, cancel context.CancelFunc, resp *session.Response, pr *parsedResponse) error {
	if !pr.stream {
		o, err := s.respondMCP(ctx, cancel, resp, pr, nil)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, o)
	}
	w := s.core.BeginStream(c, "text/event-stream")
	_, err := s.respondMCP(ctx, cancel, resp, pr, func(typ string, b []byte) error {
		return w.Write([]byte("event: " + typ + "\ndata: " + string(b) + "\n\n"))
	})
	return err
}
