package responses

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
)

// TestMCPInputMessages: the mcp items a client sends back without a stored
// history become the calls and results a session stores: an
// mcp_approval_request is the assistant's call, an mcp_call its call and
// result (its result alone after the request that made it), one without a
// result nothing; approvals' results go after their call's message and the
// results already there.
func TestMCPInputMessages(t *testing.T) {
	items := `[
		{"role": "user", "content": "hi"},
		{"type": "mcp_list_tools", "id": "mcpl_x_0", "server_label": "math", "tools": []},
		{"type": "mcp_call", "id": "mcp_c1", "server_label": "math", "name": "add", "arguments": "{\"a\":1}", "output": "2"},
		{"type": "mcp_call", "id": "mcp_c2", "server_label": "math", "name": "add", "arguments": "{}", "output": null, "error": "boom"},
		{"type": "mcp_call", "id": "mcp_c3", "server_label": "math", "name": "add", "arguments": "{}", "output": null},
		{"type": "mcp_approval_request", "id": "mcpr_c4", "server_label": "math", "name": "add", "arguments": "{}"},
		{"type": "mcp_approval_request", "id": "mcpr_c5", "server_label": "math", "name": "add", "arguments": "{}"},
		{"type": "mcp_call", "id": "mcp_c5", "server_label": "math", "name": "add", "arguments": "{}", "output": "5", "approval_request_id": "mcpr_c5"},
		{"type": "mcp_approval_response", "approval_request_id": "mcpr_c4", "approve": true}
	]`
	msgs, err := parseInput(json.RawMessage(items), "input", nil, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	show := func(ms []parley.Message) string {
		got = got[:0]
		for _, m := range ms {
			s := string(m.Role)
			for _, c := range m.ToolCalls {
				s += ":" + c.ID
				if c.Server == nil || c.Server.Label != "math" || c.Server.Tool != "add" {
					t.Errorf("call %+v is not marked as math's add", c)
				}
			}
			if m.Role == parley.RoleTool {
				s += ":" + m.ToolCallID + "=" + m.Content
				if m.ToolError != "" {
					s += "!"
				}
			}
			got = append(got, s)
		}
		return strings.Join(got, " ")
	}
	want := "user assistant:c1 tool:c1=2 assistant:c2 tool:c2=error: boom! assistant:c4 assistant:c5 tool:c5=5"
	if s := show(msgs); s != want {
		t.Errorf("messages\n%s\nwant\n%s", s, want)
	}
	if !msgs[5].ToolCalls[0].Server.Approval || msgs[1].ToolCalls[0].Server.Approval {
		t.Errorf("approval marks: %+v %+v", msgs[5].ToolCalls[0].Server, msgs[1].ToolCalls[0].Server)
	}
	r4 := parley.Message{Role: parley.RoleTool, ToolCallID: "c4", Content: "4"}
	want = "user assistant:c1 tool:c1=2 assistant:c2 tool:c2=error: boom! assistant:c4 tool:c4=4 assistant:c5 tool:c5=5"
	if s := show(afterCalls(msgs, []parley.Message{r4})); s != want {
		t.Errorf("after the approval\n%s\nwant\n%s", s, want)
	}
	// A result after the results already there.
	r1 := parley.Message{Role: parley.RoleTool, ToolCallID: "c1", Content: "again"}
	want = "user assistant:c1 tool:c1=2 tool:c1=again assistant:c2"
	if s := show(afterCalls(msgs[:4], []parley.Message{r1})); s != want {
		t.Errorf("after results\n%s\nwant\n%s", s, want)
	}

	// Without serverCalls (a request that continues a stored history) they are skipped.
	if msgs, err := parseInput(json.RawMessage(items), "input", nil, nil, false); err != nil || show(msgs) != "user" {
		t.Errorf("skipped: %s, %v", show(msgs), err)
	}
	for _, bad := range []string{
		`[{"type": "mcp_call", "id": "", "server_label": "math", "name": "add"}]`,
		`[{"type": "mcp_approval_request", "id": "mcpr_c", "name": "add"}]`,
		`[{"type": "mcp_call", "id": "mcp_c", "server_label": "math", "name": "add", "arguments": "{", "output": "x"}]`,
	} {
		if _, err := parseInput(json.RawMessage(bad), "input", nil, nil, true); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
