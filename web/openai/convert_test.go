package openai

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// The wire conversions of chat completions, without HTTP: a request's
// message to Parley's, and a reply's finish, usage and tool calls to
// OpenAI's.

func TestParseChatMessage(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		want      parley.Message
		wantField string // the field a refusal names; "" when accepted
	}{
		{"user text", `{"role":"user","content":"hi"}`, parley.Message{Role: parley.RoleUser, Content: "hi"}, ""},
		{"text parts", `{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`,
			parley.Message{Role: parley.RoleUser, Content: "ab"}, ""},
		{"system", `{"role":"system","content":"be brief"}`, parley.Message{Role: parley.RoleSystem, Content: "be brief"}, ""},
		{"assistant thought", `{"role":"assistant","content":"4","reasoning_content":"2+2"}`,
			parley.Message{Role: parley.RoleAssistant, Content: "4", Reasoning: "2+2"}, ""},
		{"calls without content", `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}}]}`,
			parley.Message{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "c1", Name: "add", Arguments: `{"a":1}`}}}, ""},
		{"tool result", `{"role":"tool","tool_call_id":"c1","content":"2"}`,
			parley.Message{Role: parley.RoleTool, Content: "2", ToolCallID: "c1"}, ""},
		{"bad role", `{"role":"robot","content":"x"}`, parley.Message{}, "messages[3].role"},
		{"empty user", `{"role":"user","content":""}`, parley.Message{}, "messages[3].content"},
		{"user calls", `{"role":"user","content":"x","tool_calls":[{"id":"c","function":{"name":"f"}}]}`, parley.Message{}, "messages[3].tool_calls"},
		{"call without id", `{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}`, parley.Message{}, "messages[3].tool_calls[0]"},
		{"arguments not JSON", `{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{"}}]}`,
			parley.Message{}, "messages[3].tool_calls[0].function.arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m openAIMessage
			if err := json.Unmarshal([]byte(tt.in), &m); err != nil {
				t.Fatal(err)
			}
			got, err := parseChatMessage(m, 3, nil)
			if tt.wantField != "" {
				if parley.ErrorCode(err) != parley.EInvalid || apicore.ErrorField(err) != tt.wantField {
					t.Fatalf("err %v (field %q), want invalid naming %q", err, apicore.ErrorField(err), tt.wantField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestCheckToolResults(t *testing.T) {
	call := parley.Message{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "c1", Name: "add"}}}
	msgs := []parley.Message{call, {Role: parley.RoleTool, ToolCallID: "c1", Content: "2"}}
	if err := checkToolResults(msgs); err != nil {
		t.Fatal(err)
	}
	if msgs[1].Name != "add" {
		t.Errorf("the result's name is %q, want the call's tool, add", msgs[1].Name)
	}
	for name, bad := range map[string]parley.Message{
		"no id":      {Role: parley.RoleTool, Content: "2"},
		"unknown id": {Role: parley.RoleTool, ToolCallID: "c9", Content: "2"},
	} {
		err := checkToolResults([]parley.Message{call, bad})
		if apicore.ErrorField(err) != "messages[1].tool_call_id" {
			t.Errorf("%s: err %v, want one naming messages[1].tool_call_id", name, err)
		}
	}
}

func TestOpenAIFinish(t *testing.T) {
	for f, want := range map[parley.FinishReason]string{
		parley.FinishStop: "stop", parley.FinishEOS: "stop", parley.FinishLength: "length",
		parley.FinishToolCalls: "tool_calls", parley.FinishError: "", parley.FinishCancelled: "",
	} {
		if got := openAIFinish(f); got != want {
			t.Errorf("openAIFinish(%s) = %q, want %q", f, got, want)
		}
	}
}

func TestOpenAIUsageAndCalls(t *testing.T) {
	u := newOpenAIUsage(parley.Usage{PromptTokens: 10, CachedPromptTokens: 4, CompletionTokens: 5, ReasoningTokens: 2})
	b, err := json.Marshal(u)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}`
	if string(b) != want {
		t.Errorf("usage %s\nwant  %s", b, want)
	}

	calls := openAIToolCalls([]parley.ToolCall{{ID: "c1", Name: "add", Arguments: `{"a":1}`}})
	if b, _ = json.Marshal(calls); string(b) != `[{"id":"c1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}}]` {
		t.Errorf("tool_calls %s", b)
	}
	// A streamed delta names its call by index; id, type and name come
	// with the call's first delta only.
	first := openAIToolDelta(parley.ToolCallDelta{Index: 0, ID: "c1", Name: "add"})
	more := openAIToolDelta(parley.ToolCallDelta{Index: 0, Arguments: `{"a"`})
	if b, _ = json.Marshal(first); string(b) != `[{"index":0,"id":"c1","type":"function","function":{"name":"add","arguments":""}}]` {
		t.Errorf("first delta %s", b)
	}
	if b, _ = json.Marshal(more); string(b) != `[{"index":0,"function":{"arguments":"{\"a\""}}]` {
		t.Errorf("later delta %s", b)
	}
}
