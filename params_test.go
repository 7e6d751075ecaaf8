package parley_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/paramstest"
)

// TestValidateNesting: grammars and schemas nested deeper than llama.cpp can
// take safely are refused by name, and ordinary nesting is accepted.
// Parentheses inside string literals, character classes and comments do not
// count.
func TestValidateNesting(t *testing.T) {
	deep := func(n int) string {
		return "root ::= " + strings.Repeat("(", n) + `"a"` + strings.Repeat(")", n)
	}
	schema := func(n int) json.RawMessage {
		return json.RawMessage(strings.Repeat(`{"items":`, n) + `{"type":"string"}` + strings.Repeat("}", n))
	}
	cases := []struct {
		name    string
		grammar string
		schema  json.RawMessage
		field   string // "" = valid
	}{
		{"flat grammar", `root ::= "yes" | "no"`, nil, ""},
		{"grammar at the limit", deep(parley.MaxGrammarDepth), nil, ""},
		{"grammar past the limit", deep(parley.MaxGrammarDepth + 1), nil, "grammar"},
		{"crash-deep grammar", deep(30000), nil, "grammar"},
		{"parens in literals and classes", "root ::= \"" + strings.Repeat("(", 400) + "\" [(\\]" + strings.Repeat("(", 400) + "] # " + strings.Repeat("(", 400) + "\n", nil, ""},
		{"escaped quote in a literal", `root ::= "\"(" ` + deep(parley.MaxGrammarDepth)[len("root ::= "):], nil, ""},
		{"flat schema", "", json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}}}`), ""},
		{"schema at the limit", "", schema(parley.MaxSchemaDepth - 1), ""},
		{"schema past the limit", "", schema(parley.MaxSchemaDepth), "json_schema"},
		{"brackets in schema strings", "", json.RawMessage(`{"description":"` + strings.Repeat("[{", 500) + `"}`), ""},
		{"deep arrays", "", json.RawMessage(strings.Repeat("[", 5000) + strings.Repeat("]", 5000)), "json_schema"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := parley.DefaultParams()
			p.Grammar, p.JSONSchema = c.grammar, c.schema
			err := p.Validate(0)
			var pe *parley.Error
			switch {
			case c.field == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case c.field != "" && err == nil:
				t.Fatalf("want an error naming %s", c.field)
			case c.field != "" && (!errors.As(err, &pe) || pe.Field != c.field || pe.Code != parley.EInvalid):
				t.Fatalf("want an invalid %s error, got %#v", c.field, err)
			}
		})
	}
}

// TestValidateSchemaLimits: a schema is converted at the edge, so one over
// a limit of the converter is refused by Validate, naming json_schema; a
// large schema whose descriptions take it past the grammar's 64 KiB is fine.
func TestValidateSchemaLimits(t *testing.T) {
	props := func(n int, desc string) json.RawMessage {
		var ps []string
		for i := range n {
			ps = append(ps, `"field_`+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("y", i/26)+`":{"type":"string","description":"`+desc+`"}`)
		}
		return json.RawMessage(`{"type":"object","properties":{` + strings.Join(ps, ",") + `}}`)
	}
	cases := []struct {
		name   string
		schema json.RawMessage
		want   string // "" = valid
	}{
		{"500 properties with descriptions, 100+ KiB", props(500, strings.Repeat("d", 200)), ""},
		{"1001 properties", props(1001, ""), "at most 1000"},
		{"over MaxSchemaLen", props(600, strings.Repeat("d", parley.MaxSchemaLen/600)), "at most 262144 bytes"},
		{"lone surrogate in an enum", json.RawMessage(`{"enum":["\udfff"]}`), "lone UTF-16 surrogate"},
		{"unsupported $ref", json.RawMessage(`{"$ref":"other.json#/x"}`), "$ref"},
	}
	for _, c := range cases {
		p := parley.DefaultParams()
		p.JSONSchema = c.schema
		err := p.Validate(0)
		var pe *parley.Error
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s (%d bytes): %v", c.name, len(c.schema), err)
		case c.want != "" && (!errors.As(err, &pe) || pe.Field != "json_schema" || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: err = %v, want a json_schema error with %q", c.name, err, c.want)
		}
	}
}

// TestValidateRecordsGrammar: Validate records the grammar it checked (a
// schema's converted) for CheckedGrammar, and a change to Grammar or to
// JSONSchema's bytes, even in place, makes the record stale: it is not
// used, and the next Validate checks the new text.
func TestValidateRecordsGrammar(t *testing.T) {
	p := parley.DefaultParams()
	if g, f, ok := p.CheckedGrammar(); ok {
		t.Fatalf("unvalidated params: CheckedGrammar = %q, %q, true", g, f)
	}
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	if g, f, ok := p.CheckedGrammar(); !ok || g != "" || f != "" {
		t.Fatalf("no grammar: CheckedGrammar = %q, %q, %v", g, f, ok)
	}

	p.JSONSchema = json.RawMessage(`{"type":"boolean"}`)
	if _, _, ok := p.CheckedGrammar(); ok {
		t.Fatal("a schema set after Validate reads as checked")
	}
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	g, f, ok := p.CheckedGrammar()
	if !ok || f != "json_schema" || !strings.Contains(g, `root ::= boolean`) {
		t.Fatalf("schema: CheckedGrammar = %q, %q, %v", g, f, ok)
	}
	copied := p // a copy keeps the record
	if g2, _, ok := copied.CheckedGrammar(); !ok || g2 != g {
		t.Fatalf("copy: CheckedGrammar = %q, %v", g2, ok)
	}

	copy(p.JSONSchema, `{"type":"boolea!"}`) // same length, changed in place
	if _, _, ok := p.CheckedGrammar(); ok {
		t.Fatal("a schema changed in place reads as checked")
	}
	var pe *parley.Error
	if err := p.Validate(0); !errors.As(err, &pe) || pe.Field != "json_schema" {
		t.Fatalf("changed schema: Validate = %v, want a json_schema error", err)
	}
	if _, _, ok := p.CheckedGrammar(); ok {
		t.Fatal("a refused schema reads as checked")
	}

	p.JSONSchema = nil
	p.Grammar = `root ::= "yes" | "no"`
	if err := p.Validate(0); err != nil {
		t.Fatal(err)
	}
	if g, f, ok := p.CheckedGrammar(); !ok || g != p.Grammar || f != "grammar" {
		t.Fatalf("grammar: CheckedGrammar = %q, %q, %v", g, f, ok)
	}
	p.Grammar = `root ::= "no"`
	if _, _, ok := p.CheckedGrammar(); ok {
		t.Fatal("a grammar changed after Validate reads as checked")
	}
}

// TestParamsHaveNoTestMethods: the validation counter tests read is reachable
// through internal/paramstest only, not through a method of the public type;
// and it counts every Validate.
func TestParamsHaveNoTestMethods(t *testing.T) {
	if _, ok := reflect.TypeOf(&parley.Params{}).MethodByName("Validations"); ok {
		t.Error("parley.Params has a Validations method: the counter is for tests only (internal/paramstest)")
	}
	p := parley.DefaultParams()
	for i := 1; i <= 3; i++ {
		if err := p.Validate(0); err != nil {
			t.Fatal(err)
		}
		if n := paramstest.Validations(&p); n != i {
			t.Fatalf("after %d Validate calls paramstest.Validations = %d", i, n)
		}
	}
}
