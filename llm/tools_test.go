package llm_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// toolSchemas are the tools the constrained-call tests offer: nested
// objects, enums, arrays and bounded numbers.
var toolSchemas = []parley.Tool{
	{Name: "get_weather", Description: "Current weather", Parameters: json.RawMessage(
		`{"type":"object","properties":{"city":{"type":"string","maxLength":20},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}`)},
	{Name: "book_trip", Parameters: json.RawMessage(
		`{"type":"object","properties":{"traveller":{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":18,"maximum":99}},"required":["name","age"],"additionalProperties":false},` +
			`"stops":{"type":"array","items":{"type":"string","maxLength":8},"minItems":1,"maxItems":3}},"required":["traveller","stops"],"additionalProperties":false}`)},
	{Name: "set_volume", Parameters: json.RawMessage(
		`{"type":"object","properties":{"level":{"type":"integer","minimum":0,"maximum":11},"muted":{"type":"boolean"}},"required":["level","muted"],"additionalProperties":false}`)},
}

// validateCall checks that call names one of tools and that its arguments
// parse and validate against that tool's schema.
func validateCall(t *testing.T, tools []parley.Tool, call parley.ToolCall) {
	t.Helper()
	for _, tool := range tools {
		if tool.Name != call.Name {
			continue
		}
		c := jsonschema.NewCompiler()
		schema, err := jsonschema.UnmarshalJSON(strings.NewReader(string(tool.Parameters)))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource("tool.json", schema); err != nil {
			t.Fatal(err)
		}
		sch, err := c.Compile("tool.json")
		if err != nil {
			t.Fatal(err)
		}
		args, err := jsonschema.UnmarshalJSON(strings.NewReader(call.Arguments))
		if err != nil {
			t.Fatalf("call %s: arguments do not parse: %v\n%s", call.Name, err, call.Arguments)
		}
		if err := sch.Validate(args); err != nil {
			t.Fatalf("call %s: arguments do not validate: %v\n%s", call.Name, err, call.Arguments)
		}
		return
	}
	t.Fatalf("call names %q, which is no tool", call.Name)
}

type toolReply struct {
	content string
	deltas  []parley.ToolCallDelta
	final   parley.Event
}

func replyWithTools(t *testing.T, r *chat.Responder, msgs []parley.Message, p parley.Params) toolReply {
	t.Helper()
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: msgs, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	var out toolReply
	for ev := range rep.Events() {
		if ev.Done {
			out.final = ev
			continue
		}
		if ev.ToolCall != nil {
			out.deltas = append(out.deltas, *ev.ToolCall)
		}
	}
	out.content = rep.Text()
	return out
}

// checkDeltas: the streamed deltas add up to the final calls, the
// arguments over several deltas.
func checkDeltas(t *testing.T, r toolReply) {
	t.Helper()
	args := map[int]string{}
	names := map[int]string{}
	for _, d := range r.deltas {
		args[d.Index] += d.Arguments
		if d.Name != "" {
			names[d.Index] = d.Name
		}
	}
	for i, c := range r.final.ToolCalls {
		if names[i] != c.Name || args[i] != c.Arguments {
			t.Fatalf("call %d: deltas give %s(%s), the final event %s(%s)", i, names[i], args[i], c.Name, c.Arguments)
		}
	}
	if len(r.final.ToolCalls) > 0 && len(r.deltas) < 3 {
		t.Fatalf("the call streamed in %d deltas, want the arguments over several", len(r.deltas))
	}
}

// TestToolRequiredStories: with tool_choice required (and a named
// function), stories260K, which knows nothing of tools, makes a call whose
// arguments validate against the tool's schema, at several seeds.
func TestToolRequiredStories(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 2048, Parallel: 1, Threads: 1})
	r := chat.NewResponder(e)
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Once upon a time there was a cat."}}
	choices := []parley.ToolChoice{{Mode: parley.ToolRequired}}
	for _, tool := range toolSchemas {
		choices = append(choices, parley.ToolChoice{Mode: parley.ToolFunction, Name: tool.Name})
	}
	for _, choice := range choices {
		for seed := int64(1); seed <= 3; seed++ {
			p := parley.DefaultParams()
			p.MaxTokens, p.Seed, p.Temperature = 400, seed, 0.9
			p.Tools, p.ToolChoice = toolSchemas, choice
			got := replyWithTools(t, r, msgs, p)
			if got.final.Err != nil || got.final.Finish != parley.FinishToolCalls || len(got.final.ToolCalls) != 1 {
				t.Fatalf("%+v seed %d: finish %s (%v), %d calls, content %q", choice, seed, got.final.Finish, got.final.Err, len(got.final.ToolCalls), got.content)
			}
			call := got.final.ToolCalls[0]
			if choice.Name != "" && call.Name != choice.Name {
				t.Fatalf("tool_choice %s, the call is to %s", choice.Name, call.Name)
			}
			validateCall(t, toolSchemas, call)
			checkDeltas(t, got)
			if strings.TrimSpace(got.content) != "" {
				t.Fatalf("a forced call leaked into the content: %q", got.content)
			}
			t.Logf("%s seed %d: %s(%s)", choice.Mode, seed, call.Name, call.Arguments)
		}
	}
}

// hermesScript is a Qwen/Hermes-style model that says something, then calls
// get_weather in <tool_call> tags. It writes no newline: the generation
// prompt's last token is one, and a scripted reply cannot reuse it.
func hermesScript() *synth.Script {
	return &synth.Script{
		Template: "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
			"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
		Control: []string{"<|im_start|>", "<|im_end|>"},
		Text:    []string{"<tool_call>", "</tool_call>"},
		After:   "\n",
		Reply:   `Let me look that up.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call><|im_end|>`,
	}
}

// TestToolAutoScripted: with tool_choice auto the scripted model writes
// text, then the trigger, and the call grammar takes over: the content is
// the text, the call is complete and valid, and its arguments streamed.
// With tool_choice none the reply stops at the trigger.
func TestToolAutoScripted(t *testing.T) {
	e := mustOpen(t, llm.Config{Path: testmodel.Scripted(t, hermesScript()), ContextLength: 2048, Parallel: 1, Threads: 1})
	r := chat.NewResponder(e)
	// The model's own template (a minimal ChatML one that knows no tools): the ChatML family renders the tools, and
	// calls are written in its Hermes syntax.
	if r.Template().Name() != chat.NameJinja || chat.ToolSyntaxOf(r.Template()).Trigger != "<tool_call>" {
		t.Fatalf("template %s (tool trigger %q), want the model's own with Hermes calls", r.Template().Name(), chat.ToolSyntaxOf(r.Template()).Trigger)
	}
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Weather in Paris?"}}
	p := greedy(100)
	p.Tools = toolSchemas
	got := replyWithTools(t, r, msgs, p)
	if got.final.Finish != parley.FinishToolCalls || len(got.final.ToolCalls) != 1 {
		t.Fatalf("finish %s (%v), calls %+v, content %q", got.final.Finish, got.final.Err, got.final.ToolCalls, got.content)
	}
	if got.content != "Let me look that up." {
		t.Fatalf("content %q", got.content)
	}
	call := got.final.ToolCalls[0]
	if call.Name != "get_weather" || call.Arguments != `{"city": "Paris", "unit": "celsius"}` {
		t.Fatalf("call %s(%s)", call.Name, call.Arguments)
	}
	validateCall(t, toolSchemas, call)
	checkDeltas(t, got)

	p.ToolChoice = parley.ToolChoice{Mode: parley.ToolNone}
	got = replyWithTools(t, r, msgs, p)
	if len(got.final.ToolCalls) != 0 || got.content != "Let me look that up." || got.final.Finish != parley.FinishStop {
		t.Fatalf("tool_choice none: finish %s, calls %+v, content %q", got.final.Finish, got.final.ToolCalls, got.content)
	}
}

// TestToolAutoConstrains: once the trigger is written, the grammar decides.
// The scripted model means to write a call whose city is a number and whose
// unit is not in the enum; what comes back is still a call that validates,
// because from the trigger on every token is drawn under the call grammar.
func TestToolAutoConstrains(t *testing.T) {
	script := hermesScript()
	script.Reply = `Checking.<tool_call>{"name": "get_weather", "arguments": {"city": 42, "unit": "kelvin"}}</tool_call><|im_end|>`
	e := mustOpen(t, llm.Config{Path: testmodel.Scripted(t, script), ContextLength: 2048, Parallel: 1, Threads: 1})
	r := chat.NewResponder(e)
	p := greedy(300)
	p.Tools = toolSchemas
	got := replyWithTools(t, r, []parley.Message{{Role: parley.RoleUser, Content: "Weather?"}}, p)
	if got.content != "Checking." || got.final.Finish != parley.FinishToolCalls || len(got.final.ToolCalls) != 1 {
		t.Fatalf("finish %s (%v), calls %+v, content %q", got.final.Finish, got.final.Err, got.final.ToolCalls, got.content)
	}
	call := got.final.ToolCalls[0]
	if strings.Contains(call.Arguments, "42") && !strings.Contains(call.Arguments, `"42`) {
		t.Fatalf("the unconstrained number came through: %s", call.Arguments)
	}
	validateCall(t, toolSchemas, call)
	t.Logf("the model meant %s, the grammar made %s(%s)", `{"city": 42, "unit": "kelvin"}`, call.Name, call.Arguments)
}
