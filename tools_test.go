package parley_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/paramstest"
)

func weatherTool() parley.Tool {
	return parley.Tool{Name: "get_weather", Description: "Weather in a city",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}`)}
}

// TestToolsValidate: hostile or malformed tools are refused with an EInvalid
// error naming the field; good ones convert to a grammar.
func TestToolsValidate(t *testing.T) {
	many := make([]parley.Tool, 1000)
	for i := range many {
		many[i] = parley.Tool{Name: fmt.Sprintf("f%d", i)}
	}
	cases := []struct {
		name   string
		tools  []parley.Tool
		choice parley.ToolChoice
		field  string // "" = accepted
	}{
		{"one", []parley.Tool{weatherTool()}, parley.ToolChoice{}, ""},
		{"required", []parley.Tool{weatherTool()}, parley.ToolChoice{Mode: parley.ToolRequired}, ""},
		{"named", []parley.Tool{weatherTool(), {Name: "noop"}}, parley.ToolChoice{Mode: parley.ToolFunction, Name: "noop"}, ""},
		{"1000 tools", many, parley.ToolChoice{}, "tools"},
		{"duplicate", []parley.Tool{weatherTool(), weatherTool()}, parley.ToolChoice{}, "tools[1].name"},
		{"bad name", []parley.Tool{{Name: "a b"}}, parley.ToolChoice{}, "tools[0].name"},
		{"empty name", []parley.Tool{{}}, parley.ToolChoice{}, "tools[0].name"},
		{"recursive", []parley.Tool{{Name: "tree", Parameters: json.RawMessage(
			`{"type":"object","properties":{"node":{"$ref":"#/$defs/node"}},"$defs":{"node":{"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}}}}}`)}},
			parley.ToolChoice{}, "tools[0].parameters"},
		{"root recursive", []parley.Tool{{Name: "tree", Parameters: json.RawMessage(`{"type":"object","properties":{"sub":{"$ref":"#"}}}`)}},
			parley.ToolChoice{}, "tools[0].parameters"},
		{"not an object", []parley.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"string"}`)}}, parley.ToolChoice{}, "tools[0].parameters"},
		{"invalid JSON", []parley.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":`)}}, parley.ToolChoice{}, "tools[0].parameters"},
		{"bad bounds", []parley.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer","minimum":10,"maximum":5}}}`)}},
			parley.ToolChoice{}, "tools[0].parameters"},
		{"unknown choice", []parley.Tool{weatherTool()}, parley.ToolChoice{Mode: "always"}, "tool_choice"},
		{"named unknown", []parley.Tool{weatherTool()}, parley.ToolChoice{Mode: parley.ToolFunction, Name: "nope"}, "tool_choice"},
		{"required without tools", nil, parley.ToolChoice{Mode: parley.ToolRequired}, "tool_choice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := parley.DefaultParams()
			p.Tools, p.ToolChoice = c.tools, c.choice
			err := p.Validate(0)
			if c.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pe *parley.Error
			if err == nil || !asError(err, &pe) || pe.Code != parley.EInvalid || pe.Field != c.field {
				t.Fatalf("got %v, want an EInvalid error naming %q", err, c.field)
			}
		})
	}
}

func asError(err error, pe **parley.Error) bool {
	e, ok := err.(*parley.Error)
	*pe = e
	return ok
}

// TestToolGrammars: a forced call's grammar starts with the syntax's Open
// and ends with its Close; the lazy grammar starts after the trigger.
func TestToolGrammars(t *testing.T) {
	syn := parley.ToolSyntax{Trigger: "<tool_call>", Open: "<tool_call>\n", Close: "\n</tool_call>"}
	p := parley.DefaultParams()
	p.Tools, p.ToolSyntax = []parley.Tool{weatherTool()}, syn
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	if g, _, _ := p.CheckedGrammar(); g != "" {
		t.Fatalf("auto must not constrain from the first token, got %q", g)
	}
	trig, lazy, ok := p.LazyToolGrammar()
	if !ok || trig != "<tool_call>" || !strings.HasPrefix(lazy, `root ::= tool-ws tool-call tool-ws "</tool_call>"`) {
		t.Fatalf("lazy grammar: %v %q %q", ok, trig, lazy)
	}
	p.ToolChoice = parley.ToolChoice{Mode: parley.ToolRequired}
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	g, field, ok := p.CheckedGrammar()
	if !ok || field != "tools" || !strings.HasPrefix(g, `root ::= "<tool_call>" tool-ws tool-call tool-ws "</tool_call>"`) || !strings.Contains(g, `get_weather`) {
		t.Fatalf("forced grammar (%v, %q):\n%s", ok, field, g)
	}
	if _, _, ok := p.LazyToolGrammar(); ok {
		t.Fatal("a forced call has no lazy grammar")
	}
	p.Grammar = `root ::= "x"`
	if err := p.Validate(0); err == nil {
		t.Fatal("tools with a grammar accepted")
	}
}

// TestSetToolSyntax: on validated params SetToolSyntax converts the call
// grammar for the syntax's argument key without validating again; on params
// never validated, or changed since, it validates, so their errors show.
func TestSetToolSyntax(t *testing.T) {
	llama := parley.ToolSyntax{Trigger: "<|python_tag|>", ArgsKey: "parameters"}

	p := parley.DefaultParams()
	p.Tools, p.ToolChoice = []parley.Tool{weatherTool()}, parley.ToolChoice{Mode: parley.ToolRequired}
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	if err := p.SetToolSyntax(llama); err != nil {
		t.Fatal(err)
	}
	if n := paramstest.Validations(&p); n != 1 {
		t.Errorf("validated %d times, want 1", n)
	}
	g, field, ok := p.CheckedGrammar()
	if !ok || field != "tools" || !strings.Contains(g, `\"parameters\"`) || strings.Contains(g, `\"arguments\"`) {
		t.Errorf("CheckedGrammar() = %q, %q, %v; want the call grammar keyed by parameters", g, field, ok)
	}

	p.Tools = append(p.Tools, parley.Tool{Name: "bad name"}) // changed after the edge
	err := p.SetToolSyntax(llama)
	if err == nil || !strings.Contains(err.Error(), "tools[1].name") {
		t.Errorf("SetToolSyntax on changed tools = %v, want the bad name refused", err)
	}
	if n := paramstest.Validations(&p); n != 2 {
		t.Errorf("validated %d times, want 2", n)
	}

	var never parley.Params // never validated: max_tokens 0 is refused
	never.Tools = []parley.Tool{weatherTool()}
	if err := never.SetToolSyntax(llama); err == nil || !strings.Contains(err.Error(), "max_tokens") {
		t.Errorf("SetToolSyntax on unvalidated params = %v, want max_tokens refused", err)
	}
}

// TestSetToolChoice: on validated params SetToolChoice changes the choice
// without validating again, and the call grammar follows it (every tool
// after a function choice, none with ToolNone); a choice that does not fit
// the tools is refused; on params never validated it validates.
func TestSetToolChoice(t *testing.T) {
	clock := parley.Tool{Name: "get_time", Parameters: json.RawMessage(`{"type":"object","properties":{"zone":{"type":"string"}}}`)}
	p := parley.DefaultParams()
	p.Tools = []parley.Tool{weatherTool(), clock}
	p.ToolChoice = parley.ToolChoice{Mode: parley.ToolFunction, Name: "get_weather"}
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	g, _, _ := p.CheckedGrammar()
	if strings.Contains(g, "get_time") {
		t.Fatalf("the function choice's grammar offers the other tool:\n%s", g)
	}

	free := p
	if err := free.SetToolChoice(parley.ToolChoice{Mode: parley.ToolAuto}); err != nil {
		t.Fatal(err)
	}
	if n := paramstest.Validations(&free); n != 1 {
		t.Errorf("validated %d times, want 1 (the edge's)", n)
	}
	_, lazy, ok := free.LazyToolGrammar()
	if ok {
		t.Error("a lazy grammar without a syntax trigger")
	}
	if err := free.SetToolSyntax(parley.ToolSyntax{Trigger: "<tool_call>", Open: "<tool_call>\n", Close: "\n</tool_call>"}); err != nil {
		t.Fatal(err)
	}
	if _, lazy, ok = free.LazyToolGrammar(); !ok || !strings.Contains(lazy, "get_weather") || !strings.Contains(lazy, "get_time") {
		t.Errorf("LazyToolGrammar after the choice turned auto = %v:\n%s\nwant both tools", ok, lazy)
	}
	if n := paramstest.Validations(&free); n != 1 {
		t.Errorf("validated %d times, want 1", n)
	}

	// The same as a full validation gives.
	want := p
	want.ToolChoice = parley.ToolChoice{Mode: parley.ToolAuto}
	want.ToolSyntax = free.ToolSyntax
	if err := want.Validate(0); err != nil {
		t.Fatal(err)
	}
	if _, wantLazy, _ := want.LazyToolGrammar(); wantLazy != lazy {
		t.Errorf("SetToolChoice's grammar differs from Validate's:\n%s\nwant\n%s", lazy, wantLazy)
	}

	none := p
	if err := none.SetToolChoice(parley.ToolChoice{Mode: parley.ToolNone}); err != nil {
		t.Fatal(err)
	}
	if g, field, ok := none.CheckedGrammar(); !ok || g != "" || field != "" {
		t.Errorf("CheckedGrammar with ToolNone = %q, %q, %v", g, field, ok)
	}
	if err := none.SetToolChoice(parley.ToolChoice{Mode: parley.ToolFunction, Name: "get_time"}); err != nil {
		t.Fatal(err)
	}
	if g, _, ok := none.CheckedGrammar(); !ok || !strings.Contains(g, "get_time") || strings.Contains(g, "get_weather") {
		t.Errorf("CheckedGrammar after none -> get_time = %v:\n%s", ok, g)
	}
	if n := paramstest.Validations(&none); n != 1 {
		t.Errorf("validated %d times, want 1", n)
	}

	for _, bad := range []parley.ToolChoice{{Mode: parley.ToolFunction, Name: "nope"}, {Mode: "sometimes"}, {Mode: parley.ToolAuto, Name: "get_time"}} {
		q := p
		if err := q.SetToolChoice(bad); err == nil || !strings.Contains(err.Error(), "tool_choice") {
			t.Errorf("SetToolChoice(%+v) = %v, want tool_choice refused", bad, err)
		}
		if _, _, ok := q.CheckedGrammar(); ok {
			t.Errorf("SetToolChoice(%+v) refused, but the params still count as checked", bad)
		}
	}

	var never parley.Params // never validated: max_tokens 0 is refused
	never.Tools = []parley.Tool{weatherTool()}
	if err := never.SetToolChoice(parley.ToolChoice{Mode: parley.ToolRequired}); err == nil || !strings.Contains(err.Error(), "max_tokens") {
		t.Errorf("SetToolChoice on unvalidated params = %v, want max_tokens refused", err)
	}
}
