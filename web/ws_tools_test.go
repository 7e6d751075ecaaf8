package web_test

import (
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/jsonmode"
)

// TestJSONModeToolCalls: in the WebSocket JSON mode a prompt with tools and
// tool_choice required streams tool_call messages (id and name first, the
// arguments over several) and a done message with the call; a tool_result
// answering it continues the conversation with a reply; a result for an
// unknown call is an error naming tool_call_id; and the stored session (seen
// on resuming) holds the call and the result.
func TestJSONModeToolCalls(t *testing.T) {
	s := openStack(t, stackOpts{parallel: 1, contextLen: 2048})
	ws := dial(t, s.url+"/ws?format=json", nil)
	id := readJSON(t, ws).SessionID()
	params := map[string]any{"max_tokens": 200, "tools": weatherTools, "tool_choice": "required"}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Weather in Paris?", "params": params})
	var calls []jsonmode.Message
	var done jsonmode.Message
	for done.Type == "" {
		switch m := readJSON(t, ws); m.Type {
		case "tool_call":
			calls = append(calls, m)
		case "token":
		case "done", "error":
			done = m
		default:
			t.Fatalf("unexpected message %+v", m)
		}
	}
	if done.Type != "done" || done.FinishReason != "tool_calls" || len(done.ToolCalls) != 1 || len(calls) < 3 {
		t.Fatalf("done %+v after %d tool_call messages", done, len(calls))
	}
	call := done.ToolCalls[0]
	var args string
	for _, m := range calls {
		args += m.Arguments
	}
	if calls[0].SessionID() != call.ID || calls[0].Name != "get_weather" || args != call.Arguments {
		t.Fatalf("streamed %s %s(%s), done %+v", calls[0].SessionID(), calls[0].Name, args, call)
	}
	checkWeatherArgs(t, call.Arguments)

	ws.WriteJSON(map[string]any{"type": "tool_result", "tool_call_id": "call_unknown", "content": "x"})
	if _, e := readUntilDone(t, ws); e.Type != "error" || e.Field != "tool_call_id" {
		t.Fatalf("unknown call: %+v", e)
	}
	ws.WriteJSON(map[string]any{"type": "tool_result", "tool_call_id": call.ID, "content": `{"temperature": 21}`, "params": map[string]any{"max_tokens": 6}})
	if _, d := readUntilDone(t, ws); d.Type != "done" || d.FinishReason == "tool_calls" {
		t.Fatalf("after the result: %+v", d)
	}
	ws.Close()

	ws = dial(t, s.url+"/ws?format=json&session="+id, nil)
	open := readJSON(t, ws)
	var roles []string
	for _, m := range open.Messages {
		roles = append(roles, string(m.Role))
	}
	if strings.Join(roles, ",") != "user,assistant,tool,assistant" || len(open.Messages[1].ToolCalls) != 1 ||
		open.Messages[1].ToolCalls[0] != call || open.Messages[2].ToolCallID != call.ID || open.Messages[2].Role != parley.RoleTool {
		t.Fatalf("resumed history %+v", open.Messages)
	}
}
