package gbnf_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/gbnf"
)

// jsonGrammar is llama.cpp's json.gbnf, a realistic grammar that must pass.
const jsonGrammar = `root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
`

func TestCheckAccepts(t *testing.T) {
	for name, g := range map[string]string{
		"json":       jsonGrammar,
		"literal":    `root ::= "yes" | "no"`,
		"class":      `root ::= [a-z]+ [^\n]*`,
		"repeat":     `root ::= "a"{2,5} "b"{3} "c"{1,}`,
		"recursive":  "root ::= item\nitem ::= \"(\" item? \")\" | \"x\"",
		"tokens":     `root ::= <[12]> !<[3]>`,
		"any":        `root ::= . .?`,
		"comment":    "# hello\nroot ::= \"a\" # trailing\n",
		"crlf":       "root ::= a\r\na ::= \"x\"\r\n",
		"max repeat": `root ::= "a"{0,2000}`,
	} {
		if err := gbnf.Check(g, gbnf.Limits{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheckRejects(t *testing.T) {
	nested := "root ::= a0\n"
	for i := range 20 {
		nested += "a" + strconv.Itoa(i) + " ::= (\"x\" | \"\") a" + strconv.Itoa(i+1) + " a" + strconv.Itoa(i+1) + "\n"
	}
	nested += "a20 ::= \"y\" | \"\"\n"
	for _, tc := range []struct {
		name, g, want string
	}{
		{"empty class", `root ::= "a" []`, "empty"},
		{"empty negated class", `root ::= [^]`, "empty"},
		{"negated all", `root ::= "a" [^\x00-\U0010FFFF]`, "matches nothing"},
		{"reversed range", `root ::= [z-a]`, "reversed"},
		{"max below min", `root ::= "a"{5,2}`, "maximum below its minimum"},
		{"huge bound", `root ::= "a"{0,99999999999999999999}`, "above 2000"},
		{"bound over cap", `root ::= "a"{2001}`, "above 2000"},
		{"element bomb", `root ::= "` + strings.Repeat("a", 2000) + `"{2000}`, "elements"},
		{"deep", "root ::= " + strings.Repeat("(", 300) + `"a"` + strings.Repeat(")", 300), "deep"},
		{"nested nullable", nested, "too many ways"},
		{"repeated ambiguous nullable group", `root ::= ("a"? | "b"?){30} "c"`, "too many ways"},
		{"nested optional groups", "root ::= " + strings.Repeat(`("a"? `, 12) + strings.Repeat(`"b"?)? `, 12), ""},
		{"no root", `other ::= "a"`, "no root"},
		{"undefined", `root ::= missing`, "not defined"},
		{"left recursion", "root ::= root \"a\" | \"b\"", "left-recursive"},
		{"unterminated", `root ::= "abc`, "unterminated"},
		{"bad escape", `root ::= "\q"`, "escape"},
		{"nul", "root ::= \"a\x00\"", "NUL"},
		{"no repeat item", `root ::= *`, "no preceding item"},
		{"text token", `root ::= <hello>`, "numeric id"},
		{"empty token", `root ::= <[]>`, "numeric id"},
		{"twice", "root ::= \"a\"\nroot ::= \"b\"", "twice"},
	} {
		err := gbnf.Check(tc.g, gbnf.Limits{})
		if err == nil {
			if tc.want != "" {
				t.Errorf("%s: accepted", tc.name)
			}
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not mention %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckSchema(t *testing.T) {
	ok := []string{
		`{"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":20},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name"]}`,
		`{"type":"array","items":{"type":"number","exclusiveMinimum":0},"minItems":1,"maxItems":5}`,
		`{"type":"string","pattern":"^[a-z]+(-[a-z0-9]{1,8})*$"}`,
		`{"type":"object","properties":{"pattern":{"type":"string"},"minimum":{"type":"integer"}}}`,
		`{"type":"integer","minimum":10,"maximum":10}`,
		`{"type":"string","maxLength":1e9}`, // past the repetition cap: no maximum
		`{"type":"string","minLength":3,"maxLength":524288}`,
	}
	for _, s := range ok {
		if err := gbnf.CheckSchema([]byte(s), gbnf.Limits{}); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"string","minLength":5,"maxLength":2}`, "minLength 5 is above maxLength 2"},
		{`{"type":"array","minItems":3,"maxItems":1}`, "minItems 3 is above maxItems 1"},
		{`{"type":"string","minLength":1e9}`, "at most 2000"},
		{`{"type":"string","minLength":-1}`, "non-negative"},
		{`{"type":"number","minimum":5,"maximum":1}`, "empty"},
		{`{"type":"integer","minimum":10,"exclusiveMaximum":10}`, "empty"},
		{`{"type":"integer","exclusiveMinimum":10,"exclusiveMaximum":11}`, "no integer"},
		{`{"type":"integer","minimum":10.2,"maximum":10.8}`, "no integer"},
		{`{"type":"integer","minimum":-5e15}`, "within"},
		{`{"type":"integer","minimum":0,"maximum":9007199254740990}`, "within"},
		{`{"type":"object","properties":{"a":{"type":"string","maxLength":1,"minLength":4}}}`, "properties.a: minLength"},
		{`{"type":"string","pattern":"^(?=a)b$"}`, "(?...)"},
		{`{"type":"string","pattern":"^[[:alpha:]]+$"}`, "POSIX"},
		{`{"type":"string","pattern":"^(a)\\1$"}`, `\1`},
		{`{"type":"string","pattern":"^a{5,2}$"}`, "below its minimum"},
		{`{"type":"string","pattern":"^a{0,5000}$"}`, "more than 2000"},
		{`{"type":"string","pattern":"abc"}`, "start with ^"},
		{`{"type":"string","pattern":"^*a$"}`, "nothing before"},
		{`{"type":"string","pattern":"^(a$"}`, "unclosed"},
		{`{"type":"string","pattern":"^[]$"}`, "empty character class"},
		{`{"type":"string","pattern":""}`, "start with ^"},
		{`{"anyOf":[{"type":"string"},{"type":"string","minItems":2,"maxItems":1}]}`, "anyOf[1]"},
	} {
		err := gbnf.CheckSchema([]byte(tc.schema), gbnf.Limits{})
		if err == nil {
			t.Errorf("%s: accepted", tc.schema)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not mention %q", tc.schema, err, tc.want)
		}
	}
}

// FuzzCheck makes sure no input panics the checker or runs away.
func FuzzCheck(f *testing.F) {
	f.Add(jsonGrammar)
	f.Add(`root ::= "a"{5,2}`)
	f.Add(`root ::= [^\x00-\U0010FFFF]`)
	f.Fuzz(func(t *testing.T, g string) {
		_ = gbnf.Check(g, gbnf.Limits{})
	})
}

func BenchmarkCheckJSONGrammar(b *testing.B) {
	for b.Loop() {
		if err := gbnf.Check(jsonGrammar, gbnf.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheck64KiB: a 64 KiB grammar of many rules, the largest a
// request may send.
func BenchmarkCheck64KiB(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("root ::= r0\n")
	for i := 0; sb.Len() < 64<<10-100; i++ {
		// [0-9], not [a-z]: letters would let "ab" and "end" be read as
		// the class too, and the stacks of that ambiguity grow with the
		// text (refused as too costly to match).
		sb.WriteString("r" + strconv.Itoa(i) + ` ::= "ab" [0-9]{0,3} ("x" | "y")? r` + strconv.Itoa(i+1) + " | \"end\"\n")
	}
	g := sb.String()
	g = g[:strings.LastIndex(g, "\n")]
	g = g[:strings.LastIndex(g, "\n")+1]
	n := strings.Count(g, "\n")
	g += "r" + strconv.Itoa(n-1) + ` ::= "z"` + "\n"
	if err := gbnf.Check(g, gbnf.Limits{}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(g)))
	for b.Loop() {
		_ = gbnf.Check(g, gbnf.Limits{})
	}
}
