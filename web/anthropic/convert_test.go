package anthropic

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"reflect"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// The Messages API's wire conversions, without HTTP: a request's messages,
// tools, tool choice and thinking to Parley's, and a reply's stop reason
// and usage to Anthropic's.

func TestParseAnthropicMessage(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		ids       map[string]string // tool_use ids seen before the message
		want      []parley.Message
		wantField string // the field a refusal names; "" when accepted
	}{
		{"string", `{"role":"user","content":"hi"}`, nil, []parley.Message{{Role: parley.RoleUser, Content: "hi"}}, ""},
		{"text blocks", `{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, nil,
			[]parley.Message{{Role: parley.RoleUser, Content: "ab"}}, ""},
		{"thought and tool use", `{"role":"assistant","content":[{"type":"thinking","thinking":"sum","signature":""},{"type":"tool_use","id":"t1","name":"add","input":{ "a": 1 }}]}`, nil,
			[]parley.Message{{Role: parley.RoleAssistant, Reasoning: "sum", ToolCalls: []parley.ToolCall{{ID: "t1", Name: "add", Arguments: `{"a":1}`}}}}, ""},
		{"results before text", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"2"},{"type":"text","text":"and?"}]}`,
			map[string]string{"t1": "add"},
			[]parley.Message{{Role: parley.RoleTool, Content: "2", ToolCallID: "t1", Name: "add"}, {Role: parley.RoleUser, Content: "and?"}}, ""},
		{"error result", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"no","is_error":true}]}`,
			map[string]string{"t1": "add"}, []parley.Message{{Role: parley.RoleTool, Content: "Error: no", ToolCallID: "t1", Name: "add"}}, ""},
		{"no content", `{"role":"user"}`, nil, nil, "messages[2].content"},
		{"bad role", `{"role":"tool","content":"x"}`, nil, nil, "messages[2].role"},
		{"no role", `{"content":"x"}`, nil, nil, "messages[2].role"},
		{"image without a source", `{"role":"user","content":[{"type":"image","source":{}}]}`, nil, nil, "messages[2].content[0].source.type"},
		{"user tool use", `{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}`, nil, nil, "messages[2].content[0].type"},
		{"input not an object", `{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}`, nil, nil, "messages[2].content[0].input"},
		{"unknown result", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t9","content":"2"}]}`, nil, nil, "messages[2].content[0].tool_use_id"},
		{"text of the wrong type", `{"role":"user","content":[{"type":"text","text":3}]}`, nil, nil, "messages[2].content[0].text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m anthropicMessage
			if err := json.Unmarshal([]byte(tt.in), &m); err != nil {
				t.Fatal(err)
			}
			ids := map[string]string{}
			for k, v := range tt.ids {
				ids[k] = v
			}
			var blocks blockCounter
			got, err := parseAnthropicMessage(m, "messages[2]", &blocks, ids, nil)
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

// An image block keeps its place among the message's text blocks.
func TestParseAnthropicImagePlaces(t *testing.T) {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, 2, 2))); err != nil {
		t.Fatal(err)
	}
	img := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + base64.StdEncoding.EncodeToString(b.Bytes()) + `"}}`
	var m anthropicMessage
	if err := json.Unmarshal([]byte(`{"role":"user","content":[{"type":"text","text":"Before "},`+img+`,{"type":"text","text":"after."},`+img+`]}`), &m); err != nil {
		t.Fatal(err)
	}
	var blocks blockCounter
	got, err := parseAnthropicMessage(m, "messages[0]", &blocks, map[string]string{}, (&apicore.Core{}).Images(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Content != "Before after." || len(got[0].Images) != 2 ||
		got[0].Images[0].Offset != len("Before ") || got[0].Images[1].Offset != len("Before after.") {
		t.Errorf("got %+v", got)
	}
	// A tool result and an image without text: the image stays, in a user message after the result.
	if err := json.Unmarshal([]byte(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"2"},`+img+`]}`), &m); err != nil {
		t.Fatal(err)
	}
	got, err = parseAnthropicMessage(m, "messages[0]", &blocks, map[string]string{"t1": "add"}, (&apicore.Core{}).Images(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Role != parley.RoleTool || got[1].Role != parley.RoleUser || len(got[1].Images) != 1 {
		t.Errorf("a tool result and an image: %+v", got)
	}
}

func TestParseAnthropicTools(t *testing.T) {
	tools, err := parseAnthropicTools(json.RawMessage(`[{"name":"add","description":"sums","input_schema":{"type":"object"}}]`))
	want := []parley.Tool{{Name: "add", Description: "sums", Parameters: json.RawMessage(`{"type":"object"}`)}}
	if err != nil || !reflect.DeepEqual(tools, want) {
		t.Fatalf("tools %+v, %v; want %+v", tools, err, want)
	}
	for raw, field := range map[string]string{
		`{"name":"add"}`:                     "tools",
		`[{"name":"add"}]`:                   "tools[0].input_schema",
		`[{"type":"web_search","name":"s"}]`: "tools[0].type",
	} {
		if _, err := parseAnthropicTools(json.RawMessage(raw)); apicore.ErrorField(err) != field {
			t.Errorf("%s: err %v, want one naming %s", raw, err, field)
		}
	}
}

func TestParseAnthropicToolChoice(t *testing.T) {
	tests := []struct {
		in        string
		want      parley.ToolChoice
		wantField string
	}{
		{`{"type":"auto"}`, parley.ToolChoice{Mode: parley.ToolAuto}, ""},
		{`{"type":"any","disable_parallel_tool_use":true}`, parley.ToolChoice{Mode: parley.ToolRequired}, ""},
		{`{"type":"none"}`, parley.ToolChoice{Mode: parley.ToolNone}, ""},
		{`{"type":"tool","name":"add"}`, parley.ToolChoice{Mode: parley.ToolFunction, Name: "add"}, ""},
		{`{"type":"tool"}`, parley.ToolChoice{}, "tool_choice.name"},
		{`{"type":"all"}`, parley.ToolChoice{}, "tool_choice.type"},
		{`"auto"`, parley.ToolChoice{}, "tool_choice"},
	}
	for _, tt := range tests {
		got, err := parseAnthropicToolChoice(json.RawMessage(tt.in))
		if tt.wantField != "" {
			if apicore.ErrorField(err) != tt.wantField {
				t.Errorf("%s: err %v, want one naming %s", tt.in, err, tt.wantField)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestAnthropicThinking(t *testing.T) {
	budget, zero := 512, 0
	on := func(p parley.Params) bool { return p.Think != nil && *p.Think }
	var p parley.Params
	if err := (&anthropicThinking{Type: "enabled", BudgetTokens: &budget}).apply(&p); err != nil || !on(p) || p.ThinkBudget != 512 {
		t.Errorf("enabled: %+v, %v", p, err)
	}
	p = parley.Params{}
	if err := (&anthropicThinking{Type: "disabled"}).apply(&p); err != nil || p.Think == nil || *p.Think {
		t.Errorf("disabled: %+v, %v", p, err)
	}
	p = parley.Params{}
	if err := (&anthropicThinking{Type: "adaptive"}).apply(&p); err != nil || p.Think != nil {
		t.Errorf("adaptive leaves the model's default: %+v, %v", p, err)
	}
	if err := (&anthropicThinking{Type: "enabled", BudgetTokens: &zero}).apply(&p); apicore.ErrorField(err) != "thinking.budget_tokens" {
		t.Errorf("budget 0: %v", err)
	}
	if err := (&anthropicThinking{Type: "on"}).apply(&p); apicore.ErrorField(err) != "thinking.type" {
		t.Errorf("type on: %v", err)
	}
}

func TestAnthropicStop(t *testing.T) {
	stops := []string{"END"}
	tests := []struct {
		name     string
		ev       parley.Event
		stop     string
		want     string
		wantSeq  string
		maxToken int
	}{
		{"eos", parley.Event{Finish: parley.FinishEOS}, "", "end_turn", "", 10},
		{"request's stop", parley.Event{Finish: parley.FinishStop}, "END", "stop_sequence", "END", 10},
		{"template's stop", parley.Event{Finish: parley.FinishStop}, "<|im_end|>", "end_turn", "", 10},
		{"tool call", parley.Event{Finish: parley.FinishToolCalls}, "", "tool_use", "", 10},
		{"reply cap", parley.Event{Finish: parley.FinishLength, Usage: parley.Usage{CompletionTokens: 10}}, "", "max_tokens", "", 10},
		{"context full", parley.Event{Finish: parley.FinishLength, Usage: parley.Usage{CompletionTokens: 3}}, "", "model_context_window_exceeded", "", 10},
	}
	for _, tt := range tests {
		reason, seq := anthropicStop(tt.ev, tt.stop, stops, tt.maxToken)
		got := ""
		if seq != nil {
			got = *seq
		}
		if reason != tt.want || got != tt.wantSeq {
			t.Errorf("%s: %q %q, want %q %q", tt.name, reason, got, tt.want, tt.wantSeq)
		}
	}
	u := newAnthropicUsage(parley.Usage{PromptTokens: 10, CachedPromptTokens: 4, CompletionTokens: 5})
	if u != (anthropicUsage{InputTokens: 6, OutputTokens: 5, CacheReadInputTokens: 4}) {
		t.Errorf("usage %+v: input_tokens are the uncached ones, cache reads apart", u)
	}
}
