package servertools_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/servertools"
)

// TestSplitTools: mcp entries leave a request's tools as a selection, the
// function tools stay as they were; a bad entry is an error naming its field.
func TestSplitTools(t *testing.T) {
	fn := `{"type":"function","function":{"name":"f"}}`
	for _, tc := range []struct {
		name, in, rest, field string
		all                   bool
		servers               []string
	}{
		{name: "none", in: `[` + fn + `]`, rest: `[` + fn + `]`},
		{name: "absent", in: ``, rest: ``},
		{name: "one server", in: `[` + fn + `,{"type":"mcp","server_label":"math","allowed_tools":["add"]}]`, rest: `[` + fn + `]`, servers: []string{"math"}},
		{name: "only servers", in: `[{"type":"mcp","server_label":"a"},{"type":"mcp","server_label":"b","require_approval":"never"}]`, servers: []string{"a", "b"}},
		{name: "all", in: `[{"type":"mcp","server_label":"*"}]`, all: true},
		{name: "no label", in: `[{"type":"mcp"}]`, field: "tools[0].server_label"},
		{name: "approval", in: `[` + fn + `,{"type":"mcp","server_label":"a","require_approval":"always"}]`, field: "tools[1].require_approval"},
		{name: "all and one", in: `[{"type":"mcp","server_label":"*"},{"type":"mcp","server_label":"a"}]`, field: "tools"},
		{name: "all with tools", in: `[{"type":"mcp","server_label":"*","allowed_tools":["x"]}]`, field: "tools[0].allowed_tools"},
		{name: "not an array", in: `{"type":"mcp"}`, rest: `{"type":"mcp"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rest, sel, err := servertools.SplitTools(json.RawMessage(tc.in), "tools")
			if tc.field != "" {
				var pe *parley.Error
				if !errors.As(err, &pe) || pe.Field != tc.field {
					t.Fatalf("error %v, want one naming %q", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(rest) != tc.rest {
				t.Errorf("rest %s, want %s", rest, tc.rest)
			}
			if (sel == nil) != (!tc.all && len(tc.servers) == 0) {
				t.Fatalf("selection %+v", sel)
			}
			if sel == nil {
				return
			}
			if sel.All != tc.all || len(sel.Servers) != len(tc.servers) {
				t.Fatalf("selection %+v", sel)
			}
			for i, s := range sel.Servers {
				if s.ServerLabel != tc.servers[i] || s.RequireApproval.Requires("anything") {
					t.Errorf("server %d: %+v", i, s)
				}
			}
		})
	}
}

// TestFindCall finds a call by id in a conversation and says whether a tool
// message answers it.
func TestFindCall(t *testing.T) {
	msgs := []parley.Message{
		{Role: parley.RoleUser, Content: "hi"},
		{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "a", Name: "x"}, {ID: "b", Name: "y"}}},
		{Role: parley.RoleTool, ToolCallID: "a", Content: "1"},
	}
	if c, answered, ok := servertools.FindCall(msgs, "a"); !ok || !answered || c.Name != "x" {
		t.Errorf("a: %+v %v %v", c, answered, ok)
	}
	if c, answered, ok := servertools.FindCall(msgs, "b"); !ok || answered || c.Name != "y" {
		t.Errorf("b: %+v %v %v", c, answered, ok)
	}
	if _, _, ok := servertools.FindCall(msgs, "c"); ok {
		t.Error("c found")
	}
}
