package gbnf_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/gbnf"
)

// flatSchema is an object of n properties with descriptive names, a
// description and a maxLength each; every other one is required.
func flatSchema(n int, required bool) string {
	var props, req []string
	for i := range n {
		name := fmt.Sprintf("customer_record_field_number_%d", i)
		props = append(props, fmt.Sprintf(`%q:{"type":"string","maxLength":40,"description":"The value of field %d of the customer record."}`, name, i))
		if required && i%2 == 0 {
			req = append(req, fmt.Sprintf("%q", name))
		}
	}
	return `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + strings.Join(req, ",") + `]}`
}

// treeSchema is a tree of objects, fan properties each, depth levels deep:
// fan^depth leaves of alternating types.
func treeSchema(fan, depth int) string {
	var node func(d int) string
	leaf := 0
	node = func(d int) string {
		if d == 0 {
			leaf++
			return []string{`{"type":"string"}`, `{"type":"integer","minimum":0,"maximum":100}`, `{"type":"boolean"}`, `{"enum":["a","b"]}`}[leaf%4]
		}
		var props []string
		for i := range fan {
			props = append(props, fmt.Sprintf(`"k%d_%d":%s`, d, i, node(d-1)))
		}
		return `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":["k` + fmt.Sprint(d) + `_0"]}`
	}
	return node(depth)
}

// TestSchemaToGrammarLarge: large schemas convert, pass Check, and do so
// quickly (the binding's converter truncated the grammar past about 200
// properties).
func TestSchemaToGrammarLarge(t *testing.T) {
	cases := []struct {
		name   string
		schema string
	}{
		{"300 optional properties", flatSchema(300, false)},
		{"500 properties, half required", flatSchema(500, true)},
		{"500 optional properties", flatSchema(500, false)},
		{"1000 properties, half required", flatSchema(1000, true)},
		{"2048 leaves, binary tree 11 deep", treeSchema(2, 11)},
		{"2000 leaves, 20 objects of 100", wide(20, 100, false)},
		{"2000 distinct leaves, 20 objects of 100", wide(20, 100, true)},
		{"2197 leaves, 13 wide 3 deep", treeSchema(13, 3)},
	}
	for _, c := range cases {
		t0 := time.Now()
		g, err := gbnf.SchemaToGrammar([]byte(c.schema), gbnf.Limits{})
		d := time.Since(t0)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: schema %d bytes, grammar %d bytes, converted and checked in %v", c.name, len(c.schema), len(g), d)
	}
}

// wide is an object of n objects of m string properties each; distinct:
// every property has its own name (no two rules can be shared).
func wide(n, m int, distinct bool) string {
	var outer []string
	for i := range n {
		var inner []string
		for j := range m {
			name := fmt.Sprintf("f%d", j)
			if distinct {
				name = fmt.Sprintf("g%d_f%d", i, j)
			}
			inner = append(inner, fmt.Sprintf(`%q:{"type":"string"}`, name))
		}
		outer = append(outer, fmt.Sprintf(`"group%d":{"type":"object","properties":{%s}}`, i, strings.Join(inner, ",")))
	}
	return `{"type":"object","properties":{` + strings.Join(outer, ",") + `}}`
}

// TestSchemaToGrammarLimits: schemas over a documented limit are refused
// with an error naming it, fast: within ten times the conversion of a
// schema at the limit (1000 properties), measured in the same test on the
// same machine (a ratio, not a time, so that a busy machine does not fail
// it). Unbounded, the type bomb alone is 3^20 conversions.
func TestSchemaToGrammarLimits(t *testing.T) {
	atLimit := []byte(flatSchema(1000, true))
	var base time.Duration
	for range 3 {
		t0 := time.Now()
		if _, err := gbnf.SchemaToGrammar(atLimit, gbnf.Limits{}); err != nil {
			t.Fatal(err)
		}
		base = max(base, time.Since(t0))
	}
	t.Logf("a schema at the limit converts in %v (the slowest of three)", base)
	var enum []string
	for i := range 25_000 {
		enum = append(enum, fmt.Sprint(i))
	}
	var longNames []string
	for i := range 900 {
		longNames = append(longNames, fmt.Sprintf(`"%s%d":{"type":"string"}`, strings.Repeat("n", 1200), i))
	}
	deep := strings.Repeat(`{"type":"array","items":`, 80) + `{"type":"string"}` + strings.Repeat("}", 80)
	// Each level converts its child once per (repeated) type: 3^20.
	typeBomb := `{"type":"string"}`
	for range 20 {
		typeBomb = `{"type":["object","object","object"],"properties":{"a":` + typeBomb + `}}`
	}
	cases := []struct {
		name, schema, want string
	}{
		{"1001 properties", flatSchema(1001, false), "at most 1000"},
		{"5000 properties", flatSchema(5000, true), "limit on schema size"},
		{"25000 enum values", `{"enum":[` + strings.Join(enum, ",") + `]}`, "more than 20000 JSON values"},
		{"nesting 80 deep", deep, "more than 64 deep"},
		{"grammar over 1 MiB", `{"type":"object","properties":{` + strings.Join(longNames, ",") + `}}`, "over 1048576 bytes"},
		{"type arrays multiply", typeBomb, "sub-schemas"},
	}
	for _, c := range cases {
		t0 := time.Now()
		_, err := gbnf.SchemaToGrammar([]byte(c.schema), gbnf.Limits{})
		d := time.Since(t0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one with %q", c.name, err, c.want)
		}
		if d > 10*base {
			t.Errorf("%s: refused after %v, over ten times a schema at the limit (%v)", c.name, d, base)
		}
		t.Logf("%s (%d bytes): refused in %v: %v", c.name, len(c.schema), d, err)
	}
}

// TestSchemaToGrammarRefuses: what cannot be converted faithfully is an
// error naming the schema path.
func TestSchemaToGrammarRefuses(t *testing.T) {
	cases := []struct{ schema, want string }{
		{`{"const":"\ud800"}`, "const: a string has a lone UTF-16 surrogate"},
		{`{"enum":["ok","a\udc00b"]}`, "enum[1]: a string has"},
		{`{"type":"object","properties":{"a":{"enum":[{"k":"\udbff"}]}}}`, "properties.a.enum[0]"},
		{`{"type":"object","properties":{"\ud800x":{"type":"string"}}}`, "lone UTF-16 surrogate"},
		{`{"type":"string","pattern":"^\ud800$"}`, "pattern: has a lone UTF-16 surrogate"},
		{`{"type":"string","pattern":"^\\ud800$"}`, `lone UTF-16 surrogate \uD800`},
		{`{"type":"string","pattern":"^[\\udc00-\\udfff]$"}`, "lone UTF-16 surrogate"},
		{`{"type":"string","pattern":"^(?=a)a$"}`, "pattern: uses (?...)"},
		{`{"type":"string","pattern":"^a\\bb$"}`, `\b`},
		{`{"type":"string","pattern":"abc"}`, "must start with ^ and end with $"},
		{`{"type":"string","pattern":"^[^\\x00-\\U0010FFFF]$"}`, "pattern"},
		{`{"$ref":"https://example.com/s.json"}`, "$ref: \"https://example.com/s.json\" is not supported"},
		{`{"$ref":"#/$defs/missing"}`, "does not resolve"},
		{`{"$ref":"#"}`, "left-recursive"},
		{`{"type":"object","properties":{"a":{"type":"string"},"a":{"type":"integer"}}}`, `properties: has the property "a" twice`},
		{`{"$defs":{"a":{"type":"object","properties":{"b":{"type":"strin"}}}},"type":"object","properties":{"x":{"$ref":"#/$defs/a"}}}`, `$defs.a.properties.b.type: unknown type "strin"`},
		{`{"type":"uuid"}`, `type: unknown type "uuid"`},
		{`{"enum":[]}`, "enum: must be a non-empty array"},
		{`{"type":"object","properties":{"a":false}}`, "properties.a: schema false matches nothing"},
		{`{"allOf":[{"type":"string"},{"type":"integer"}]}`, "allOf[0]: allOf can merge only"},
		{`{"type":"integer","minimum":1e300}`, "minimum: is over 2^53-1"},
		{`{"type":"integer","minimum":5,"maximum":3}`, "no integer lies"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":2001}}}`, "properties.a.minLength: is over 2000"},
		{`{"type":"string"`, "not valid JSON"},
	}
	for _, c := range cases {
		_, err := gbnf.SchemaToGrammar([]byte(c.schema), gbnf.Limits{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one with %q", c.schema, err, c.want)
		}
	}
}

// TestSchemaToGrammarShapes: what the converter writes for the cases where
// it differs from llama.cpp on purpose, and the sharing of rules.
func TestSchemaToGrammarShapes(t *testing.T) {
	cases := []struct {
		schema string
		want   []string // substrings of the grammar
	}{
		// No bound, as clients write it: the shared integer rule.
		{`{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}`, []string{"root ::= integer\n"}},
		{`{"type":"integer","minimum":-1.7976931348623157e308,"maximum":1e308}`, []string{"root ::= integer\n"}},
		{`{"type":"integer","minimum":0,"maximum":9007199254740991}`, []string{`[0] | [1-9] [0-9]{0,15}`}},
		// A paired surrogate escape is one character.
		{`{"const":"\ud83d\ude00"}`, []string{`"\"\U0001F600\""`}},
		// Patterns: \d, a quote and a backslash as JSON writes them, (?:...).
		{`{"type":"string","pattern":"^\\d{3}\"\\\\(?:x|y)$"}`, []string{`[0-9]{3} "\\\"\\\\" ("x" | "y")`}},
		{`{"type":"string","pattern":"^[^a]$"}`, []string{`"\\\""`, `"\\\\"`, `"\\n"`}},
		// A draft 2020-12 tuple, closed by "items": false.
		{`{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false}`, []string{`"[" space integer "," space string "]" space`}},
		{`{"type":"array","items":false}`, []string{`"[" space "]" space`}},
		// An empty schema is any value.
		{`{"type":"object","properties":{"x":{}}}`, []string{`x-kv ::= "\"x\"" space ":" space value`}},
		// A maximum past the repetition cap (Claude Code's Write tool: maxLength 524288) is no maximum; a minimum
		// beside it still counts.
		{`{"type":"string","maxLength":524288}`, []string{`"\"" char* "\"" space`}},
		{`{"type":"string","minLength":2,"maxLength":524288}`, []string{`"\"" char{2,} "\"" space`}},
		{`{"type":"array","items":{"type":"integer"},"maxItems":100000}`, []string{`"[" space (integer ("," space integer)*)? "]" space`}},
	}
	for _, c := range cases {
		g, err := gbnf.SchemaToGrammar([]byte(c.schema), gbnf.Limits{})
		if err != nil {
			t.Fatalf("%s: %v", c.schema, err)
		}
		for _, w := range c.want {
			if !strings.Contains(g, w) {
				t.Errorf("%s: grammar lacks %q:\n%s", c.schema, w, g)
			}
		}
	}
	g, _ := gbnf.SchemaToGrammar([]byte(flatSchema(50, false)), gbnf.Limits{})
	if n := strings.Count(g, "\nchar ::="); n != 1 {
		t.Errorf("char is defined %d times", n)
	}
	if n := strings.Count(g, " ::= \"\\\"\" char{0,40} \"\\\"\" space"); n != 1 {
		t.Errorf("the 50 equal string schemas make %d rules, want 1 shared:\n%s", n, g[:min(len(g), 2000)])
	}
}

// TestLoneSurrogatesRefused: a GBNF escape naming a surrogate, in a literal
// or a class, is refused; llama.cpp would let the model emit the
// surrogate's three bytes, which are not UTF-8.
func TestLoneSurrogatesRefused(t *testing.T) {
	for _, g := range []string{
		`root ::= "\ud800"`,
		`root ::= "a\uDFFFb"`,
		`root ::= "\U0000D800"`,
		`root ::= [\ud800]`,
		`root ::= [a-z\udc00-\udfff]`,
		`root ::= [^\ud800]`,
		`root ::= "\U00110000"`,
	} {
		err := gbnf.Check(g, gbnf.Limits{})
		if err == nil || !strings.Contains(err.Error(), "escape") {
			t.Errorf("%s: err = %v, want a refusal naming the escape", g, err)
		}
	}
	for _, g := range []string{`root ::= "\ud7ff\ue000"`, `root ::= [\u0000-\U0010FFFF]`, `root ::= [\ud7ff-\ue000]`, "root ::= \"\U0001F600\""} {
		if err := gbnf.Check(g, gbnf.Limits{}); err != nil {
			t.Errorf("%s: %v", g, err)
		}
	}
}

func BenchmarkSchemaToGrammar500(b *testing.B) {
	s := []byte(flatSchema(500, true))
	for b.Loop() {
		if _, err := gbnf.SchemaToGrammar(s, gbnf.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzSchemaToGrammar: any input either converts to a grammar that passes
// Check or is refused with an *Error; nothing panics.
func FuzzSchemaToGrammar(f *testing.F) {
	for _, s := range []string{
		`{"type":"object","properties":{"a":{"type":"string","pattern":"^[a-z]+(?:-\\d{2,4})?$"},"b":{"$ref":"#/$defs/b"}},"required":["a"],"$defs":{"b":{"anyOf":[{"type":"integer","minimum":-5,"maximum":70},{"type":"null"}]}}}`,
		`{"type":"array","prefixItems":[{"enum":["x",1,null]},{"const":{"k":[1,2]}}],"items":false}`,
		`{"allOf":[{"properties":{"a":{"type":"boolean"}},"required":["a"]},{"anyOf":[{"properties":{"b":{"type":"string","format":"date"}}}]}]}`,
		`{"type":["string","null"],"minLength":1,"maxLength":3}`,
		`{"type":"object","additionalProperties":{"type":"number"},"properties":{"é\"\\":{"type":"string"}}}`,
		`{"type":"string","pattern":"^[^\"\\\\]*\\.(x|[A-F0-9]{2})?$"}`,
		`{"type":"integer","exclusiveMinimum":-1000000,"maximum":999999999}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := gbnf.SchemaToGrammar([]byte(s), gbnf.Limits{})
		if err != nil {
			return
		}
		if err := gbnf.Check(g, gbnf.Limits{MaxBytes: gbnf.MaxSchemaGrammar}); err != nil {
			t.Fatalf("%s converts to a grammar Check refuses: %v\n%s", s, err, g)
		}
	})
}
