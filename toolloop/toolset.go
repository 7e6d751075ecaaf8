package toolloop

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/parley-chat/parley"
)

// RemoteTool is one tool a server offers, as its Host lists it.
type RemoteTool struct {
	Name        string          // the tool's name on its server
	Description string          // what it does, for the model
	InputSchema json.RawMessage // JSON schema of its arguments (an object)
}

// Result is what a server tool returned, ready for the model.
type Result struct {
	// Content is the text the model reads: the tool's output, already capped
	// in size and cleared of the operator's secrets by the Host.
	Content string
	// IsError is set when the tool reported a failure (Content says which).
	IsError bool
}

// Host lists and calls the server tools of a user (parley.Caller.User: ""
// is the anonymous user). It enforces that user's policy: a tool the user
// may not use is neither listed nor called. mcp.Manager is one.
type Host interface {
	// Servers returns the labels of the servers user may use, sorted.
	Servers(user string) []string
	// ListTools returns the tools of server that user may call.
	ListTools(ctx context.Context, user, server string) ([]RemoteTool, error)
	// CallTool calls tool on server with args (a JSON object) for user. An
	// error means the call itself failed (refused, timed out, the server
	// crashed); its text is written for the user and the model and holds
	// no secret.
	CallTool(ctx context.Context, user, server, tool string, args json.RawMessage) (Result, error)
}

// Approval modes (Approval.Mode), as the Responses API names them.
const (
	ApprovalAlways = "always" // every call waits for the user's approval
	ApprovalNever  = "never"  // no call does
)

// Approval says which calls to a server's tools need the user's approval
// first (the Responses API's require_approval). The zero value requires it
// for every call, as OpenAI does when require_approval is absent.
type Approval struct {
	Mode   string   // the rule for tools not listed below: ApprovalAlways ("" means it) or ApprovalNever
	Always []string // tools (names on the server) that need approval whatever Mode says
	Never  []string // tools that need none
}

// Requires reports whether a call to tool (its name on the server) needs
// the user's approval.
func (a Approval) Requires(tool string) bool {
	switch {
	case slices.Contains(a.Always, tool):
		return true
	case slices.Contains(a.Never, tool):
		return false
	}
	return a.Mode != ApprovalNever
}

// MCPSpec enables one server's tools for a request: the Responses API's
// {"type": "mcp"} tool. ServerLabel names a server the operator configured;
// a server the client names by URL is not a thing Parley dials.
type MCPSpec struct {
	ServerLabel     string
	AllowedTools    []string // names on the server; empty: every tool the user may call
	RequireApproval Approval
}

// Selection says which server tools a request enables.
type Selection struct {
	// All enables every tool of every server the user may use, with no
	// approval (the chat APIs, which have no approval round-trip).
	All bool
	// Servers enables the tools of the servers named.
	Servers []MCPSpec
}

// Tool is a server tool as a request exposes it.
type Tool struct {
	Name          string          // what the model calls it: unique among the request's tools
	Server        string          // the server's label
	Remote        string          // its name on the server
	Description   string          // for the model
	Parameters    json.RawMessage // JSON schema of its arguments
	NeedsApproval bool            // a call waits for the user's approval
}

// ServerTools are the tools one server contributes to a request, for a
// listing such as the Responses API's mcp_list_tools item.
type ServerTools struct {
	Label string
	Tools []Tool
	// Err is why the server's tools could not be listed (it is down, say):
	// the request goes on without them.
	Err error
}

// Toolset is the server tools of one request beside its client tools. It is
// immutable once built and safe for concurrent use.
type Toolset struct {
	user    string // whose server tools they are: every call is made for this user
	servers []ServerTools
	byName  map[string]Tool
	byCall  map[[2]string]Tool // by server label and remote name
	client  []parley.Tool
	// skipped counts tools dropped because the server described them in a
	// way no request may (a schema that is not an object, too large, ...).
	skipped int
}

// nameRe is the rule for the names the model calls tools by (OpenAI's).
var nameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Build lists the tools sel enables for user and names them beside
// client (the request's own tools). A server named in sel that the user
// may not use is an EInvalid error; a server that cannot list its tools
// only leaves its tools out (ServerTools.Err). A tool whose description
// breaks the rules a request's tools follow is left out too.
func Build(ctx context.Context, host Host, user string, sel Selection, client []parley.Tool) (*Toolset, error) {
	ts := &Toolset{user: user, byName: map[string]Tool{}, byCall: map[[2]string]Tool{}, client: client}
	available := host.Servers(user)
	specs := sel.Servers
	if sel.All {
		specs = nil
		for _, label := range available {
			specs = append(specs, MCPSpec{ServerLabel: label, RequireApproval: Approval{Mode: ApprovalNever}})
		}
	}
	seen := map[string]bool{}
	for i, sp := range specs {
		field := fmt.Sprintf("tools[%d].server_label", i)
		if !slices.Contains(available, sp.ServerLabel) {
			return nil, parley.FieldErrorf(field, "names no MCP server you may use: %q", sp.ServerLabel)
		}
		if seen[sp.ServerLabel] {
			return nil, parley.FieldErrorf(field, "names %q a second time", sp.ServerLabel)
		}
		seen[sp.ServerLabel] = true
		st := ServerTools{Label: sp.ServerLabel}
		remote, err := host.ListTools(ctx, user, sp.ServerLabel)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			st.Err = err
		}
		for _, rt := range remote {
			if len(sp.AllowedTools) > 0 && !slices.Contains(sp.AllowedTools, rt.Name) {
				continue
			}
			t := Tool{Server: sp.ServerLabel, Remote: rt.Name, Description: rt.Description, Parameters: rt.InputSchema,
				NeedsApproval: sp.RequireApproval.Requires(rt.Name)}
			if !acceptable(&t) {
				ts.skipped++
				continue
			}
			st.Tools = append(st.Tools, t)
		}
		ts.servers = append(ts.servers, st)
	}
	ts.name()
	if n := len(client) + len(ts.byName); n > parley.MaxTools {
		return nil, parley.FieldErrorf("tools", "at most %d tools, got %d with the MCP servers' (enable fewer of their tools with allowed_tools)", parley.MaxTools, n)
	}
	return ts, nil
}

// acceptable trims t's description to the limit and reports whether t
// passes the checks a client's tool passes (a server may describe its tools
// in ways no request could: a schema that is not an object, recursive, too
// deep or too large).
func acceptable(t *Tool) bool {
	if t.Remote == "" || len(t.Remote) > 128 {
		return false
	}
	if len(t.Description) > parley.MaxToolDescription {
		t.Description = truncateUTF8(t.Description, parley.MaxToolDescription)
	}
	p := parley.DefaultParams()
	p.Tools = []parley.Tool{{Name: "t", Description: t.Description, Parameters: t.Parameters}}
	return p.Validate(0) == nil
}

// name gives every tool the name the model calls it by: its own name when
// that is a valid name no other tool of the request (client or server) has,
// else "<server>__<name>" with invalid characters replaced, made unique.
func (ts *Toolset) name() {
	count := map[string]int{}
	for _, c := range ts.client {
		count[c.Name] += 2 // a client tool keeps its name: never share it
	}
	for _, st := range ts.servers {
		for _, t := range st.Tools {
			count[t.Remote]++
		}
	}
	taken := map[string]bool{}
	for _, c := range ts.client {
		taken[c.Name] = true
	}
	for si := range ts.servers {
		st := &ts.servers[si]
		for ti := range st.Tools {
			t := &st.Tools[ti]
			name := t.Remote
			if count[name] > 1 || !nameRe.MatchString(name) {
				name = sanitize(st.Label + "__" + t.Remote)
			}
			base := name
			for k := 2; taken[name]; k++ {
				suffix := fmt.Sprintf("_%d", k)
				name = base[:min(len(base), 64-len(suffix))] + suffix
			}
			taken[name] = true
			t.Name = name
			ts.byName[name] = *t
			ts.byCall[[2]string{t.Server, t.Remote}] = *t
		}
	}
}

// sanitize makes s a valid tool name: characters outside [A-Za-z0-9_-]
// become '_', and it is cut to 64 bytes.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	if len(b) == 0 {
		return "tool"
	}
	return string(b)
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// Tools returns the server tools, server by server.
func (ts *Toolset) Tools() []Tool {
	var out []Tool
	for _, st := range ts.servers {
		out = append(out, st.Tools...)
	}
	return out
}

// Servers returns the tools of each server the request enables, with the
// error of those that could not list theirs.
func (ts *Toolset) Servers() []ServerTools { return slices.Clone(ts.servers) }

// User is the user the tools were listed for, whose calls they make.
func (ts *Toolset) User() string { return ts.user }

// Skipped returns how many tools were left out because their servers
// described them in ways no request's tool may be.
func (ts *Toolset) Skipped() int { return ts.skipped }

// Lookup returns the server tool the model calls name, if there is one.
func (ts *Toolset) Lookup(name string) (Tool, bool) {
	t, ok := ts.byName[name]
	return t, ok
}

// Find returns the tool remote of server, as this request exposes it: how a
// wire item that names a call by server label and tool (an mcp_call, an
// mcp_approval_request) becomes a parley.ToolCall again.
func (ts *Toolset) Find(server, remote string) (Tool, bool) {
	t, ok := ts.byCall[[2]string{server, remote}]
	return t, ok
}

// Params returns p with the server tools added to its (client) tools, and
// validated. A server tool the model is forced to call (tool_choice) must be
// named by the name Lookup knows.
func (ts *Toolset) Params(p parley.Params) (parley.Params, error) {
	p.Tools = slices.Clip(slices.Clone(ts.client))
	for _, t := range ts.Tools() {
		p.Tools = append(p.Tools, parley.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	if err := p.Validate(0); err != nil {
		return p, err
	}
	return p, nil
}

// clientParams returns p with only the client's tools: the last step of a
// run, when the model must answer rather than call a server tool again.
func (ts *Toolset) clientParams(p parley.Params) (parley.Params, error) {
	p.Tools = slices.Clone(ts.client)
	if len(p.Tools) == 0 {
		p.ToolChoice = parley.ToolChoice{}
	} else if p.ToolChoice.Mode == parley.ToolFunction && !slices.ContainsFunc(p.Tools, func(t parley.Tool) bool { return t.Name == p.ToolChoice.Name }) {
		p.ToolChoice = parley.ToolChoice{Mode: parley.ToolAuto}
	}
	err := p.Validate(0)
	return p, err
}

// String describes the toolset for logs: the exposed names only.
func (ts *Toolset) String() string {
	var names []string
	for _, t := range ts.Tools() {
		names = append(names, t.Server+"/"+t.Remote+" as "+t.Name)
	}
	return strings.Join(names, ", ")
}
