package parley_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
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
