package ollama

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Ollama's wire conversions, without HTTP: /api/chat's messages, format
// and keep_alive to Parley's, and a reply's calls and finish to Ollama's.

func TestParseOllamaMessages(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		want      []parley.Message
		wantField string // the field a refusal names; "" when accepted
	}{
		{"text", `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`,
			[]parley.Message{{Role: parley.RoleSystem, Content: "be brief"}, {Role: parley.RoleUser, Content: "hi"}}, ""},
		{"thought", `[{"role":"user","content":"2+2?"},{"role":"assistant","content":"4","thinking":"sum"}]`,
			[]parley.Message{{Role: parley.RoleUser, Content: "2+2?"}, {Role: parley.RoleAssistant, Content: "4", Reasoning: "sum"}}, ""},
		// Ollama's clients send calls without ids: each gets one, and a
		// result answers the earliest open call to its tool.
		{"calls and results", `[{"role":"user","content":"go"},
			{"role":"assistant","tool_calls":[{"function":{"name":"add","arguments":{ "a": 1 }}},{"function":{"name":"mul"}}]},
			{"role":"tool","content":"6","tool_name":"mul"},{"role":"tool","content":"2"}]`,
			[]parley.Message{{Role: parley.RoleUser, Content: "go"},
				{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "call_1_0", Name: "add", Arguments: `{"a":1}`}, {ID: "call_1_1", Name: "mul", Arguments: "{}"}}},
				{Role: parley.RoleTool, Content: "6", ToolCallID: "call_1_1", Name: "mul"},
				{Role: parley.RoleTool, Content: "2", ToolCallID: "call_1_0", Name: "add"}}, ""},
		{"bad role", `[{"role":"robot","content":"x"}]`, nil, "messages[0].role"},
		{"empty user", `[{"role":"user","content":""}]`, nil, "messages[0].content"},
		{"user calls", `[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]`, nil, "messages[0].tool_calls"},
		{"call without name", `[{"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]}]`, nil, "messages[0].tool_calls[0].function.name"},
		{"arguments not an object", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":[1]}}]}]`, nil, "messages[0].tool_calls[0].function.arguments"},
		{"result without a call", `[{"role":"user","content":"x"},{"role":"tool","content":"2"}]`, nil, "messages[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []ollamaMessage
			if err := json.Unmarshal([]byte(tt.in), &in); err != nil {
				t.Fatal(err)
			}
			got, err := parseOllamaMessages(in, nil)
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

func TestCheckKeepAlive(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{``, 0, true},
		{`"5m"`, 5 * time.Minute, true},
		{`"-1s"`, -time.Second, true},
		{`"300"`, 300 * time.Second, true},
		{`"-1"`, -time.Second, true},
		{`0`, 0, true},
		{`1.5`, 1500 * time.Millisecond, true},
		{`"soon"`, 0, false},
		{`true`, 0, false},
		{`1e300`, 0, false},
	}
	for _, tt := range tests {
		got, err := checkKeepAlive(json.RawMessage(tt.in))
		if !tt.ok {
			if apicore.ErrorField(err) != "keep_alive" {
				t.Errorf("%s: err %v, want one naming keep_alive", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestApplyOllamaFormat(t *testing.T) {
	tests := []struct {
		in         string
		wantSchema string
		ok         bool
	}{
		{``, "", true},
		{`""`, "", true},
		{`"json"`, `{"type":"object"}`, true},
		{`{"type":"object","properties":{"a":{"type":"number"}}}`, `{"type":"object","properties":{"a":{"type":"number"}}}`, true},
		{`"yaml"`, "", false},
		{`[1]`, "", false},
	}
	for _, tt := range tests {
		var p apicore.ParamsPatch
		err := applyOllamaFormat(json.RawMessage(tt.in), &p)
		if !tt.ok {
			if apicore.ErrorField(err) != "format" {
				t.Errorf("%s: err %v, want one naming format", tt.in, err)
			}
			continue
		}
		if err != nil || string(p.JSONSchema) != tt.wantSchema {
			t.Errorf("%s: schema %s, %v; want %s", tt.in, p.JSONSchema, err, tt.wantSchema)
		}
		if tt.wantSchema != "" && p.SchemaField != "format" {
			t.Errorf("%s: a schema's errors name %q, want format", tt.in, p.SchemaField)
		}
	}
}

func TestOllamaReplyParts(t *testing.T) {
	for f, want := range map[parley.FinishReason]string{
		parley.FinishLength: "length", parley.FinishStop: "stop", parley.FinishEOS: "stop", parley.FinishToolCalls: "stop",
	} {
		if got := ollamaDoneReason(f); got != want {
			t.Errorf("ollamaDoneReason(%s) = %q, want %q", f, got, want)
		}
	}
	b, err := json.Marshal(ollamaToolCalls([]parley.ToolCall{{ID: "c1", Name: "add", Arguments: `{"a":1}`}, {ID: "c2", Name: "mul", Arguments: `{}`}}))
	want := `[{"id":"c1","function":{"index":0,"name":"add","arguments":{"a":1}}},{"id":"c2","function":{"index":1,"name":"mul","arguments":{}}}]`
	if err != nil || string(b) != want {
		t.Errorf("tool_calls %s\nwant       %s", b, want)
	}
	// Validation names Parley's fields; the client sent Ollama's.
	if err := renameOllama(parley.FieldErrorf("max_tokens", "too many")); apicore.ErrorField(err) != "options.num_predict" {
		t.Errorf("renamed to %q, want options.num_predict", apicore.ErrorField(err))
	}
}
