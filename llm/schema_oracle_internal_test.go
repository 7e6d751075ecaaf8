package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/llama"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/gbnf"
	"github.com/parley-chat/parley/internal/testmodel"
)

// llamaAccepts reports whether llama.cpp's grammar engine accepts doc as a
// whole under grammar: a two-token vocabulary (an end token and doc as one
// token) lets Apply say whether doc is a prefix the grammar allows, and,
// after Accept, whether it may end there.
func llamaAccepts(t testing.TB, grammar, doc string) bool {
	t.Helper()
	g := llama.NewGrammar(grammar, []uint32{0, 1}, []string{"", doc}, []int32{0})
	if g == nil {
		t.Fatalf("llama.cpp does not parse the grammar:\n%s", grammar)
	}
	defer g.Free()
	cands := []llama.TokenData{{ID: 0}, {ID: 1}}
	g.Apply(cands)
	if math.IsInf(float64(cands[1].Logit), -1) {
		return false
	}
	g.Accept(1)
	cands = []llama.TokenData{{ID: 0}, {ID: 1}}
	g.Apply(cands)
	return !math.IsInf(float64(cands[0].Logit), -1)
}

// omap is a JSON object that keeps its keys' order (the grammar does).
type omap struct {
	keys []string
	vals map[string]any
}

func decodeOrdered(t testing.TB, s string) any {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var read func() any
	read = func() any {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("decode %s: %v", s, err)
		}
		switch tok {
		case json.Delim('{'):
			m := &omap{vals: map[string]any{}}
			for dec.More() {
				k, _ := dec.Token()
				m.keys = append(m.keys, k.(string))
				m.vals[k.(string)] = read()
			}
			dec.Token()
			return m
		case json.Delim('['):
			var a []any
			for dec.More() {
				a = append(a, read())
			}
			dec.Token()
			return a
		}
		return tok
	}
	return read()
}

func (m *omap) get(k string) any {
	if m == nil {
		return nil
	}
	return m.vals[k]
}

// docGen writes a JSON document that matches a schema (from the subset the
// corpus uses), choosing optional parts at random.
type docGen struct {
	root *omap
	r    *rand.Rand
	t    testing.TB
}

func (g *docGen) num(v any, def int64) int64 {
	if n, ok := v.(json.Number); ok {
		i, err := n.Int64()
		if err == nil {
			return i
		}
	}
	return def
}

func (g *docGen) resolve(ref string) *omap {
	var cur any = g.root
	for _, tok := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		cur = cur.(*omap).get(tok)
	}
	return cur.(*omap)
}

func (g *docGen) str(lo, hi int) string {
	const alphabet = "abcxyz XYZ019-_.é"
	n := lo + g.r.Intn(max(hi-lo, 0)+1)
	var b strings.Builder
	runes := []rune(alphabet)
	for range n {
		b.WriteRune(runes[g.r.Intn(len(runes))])
	}
	return b.String()
}

// dumpOrdered writes a decoded value back as compact JSON, objects in
// their order.
func dumpOrdered(v any) string {
	switch x := v.(type) {
	case *omap:
		parts := make([]string, len(x.keys))
		for i, k := range x.keys {
			parts[i] = quote(k) + ":" + dumpOrdered(x.vals[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = dumpOrdered(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func (g *docGen) value(s *omap, depth int) string {
	if ref, ok := s.get("$ref").(string); ok {
		return g.value(g.resolve(ref), depth+1)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := s.get(k).([]any); ok {
			if depth > 6 { // recursive schemas: take the last (the base case)
				return g.value(alts[len(alts)-1].(*omap), depth+1)
			}
			return g.value(alts[g.r.Intn(len(alts))].(*omap), depth+1)
		}
	}
	if c := s.get("const"); c != nil {
		return dumpOrdered(c)
	}
	if e, ok := s.get("enum").([]any); ok {
		return dumpOrdered(e[g.r.Intn(len(e))])
	}
	typ := s.get("type")
	if ts, ok := typ.([]any); ok {
		typ = ts[g.r.Intn(len(ts))]
	}
	switch typ {
	case "null":
		return "null"
	case "boolean":
		return strconv.FormatBool(g.r.Intn(2) == 0)
	case "number":
		return []string{"0", "-1.5", "3.25e2", "42"}[g.r.Intn(4)]
	case "integer":
		lo, hi := g.num(s.get("minimum"), -1000), g.num(s.get("maximum"), 100000)
		if s.get("exclusiveMinimum") != nil {
			lo = g.num(s.get("exclusiveMinimum"), 0) + 1
		}
		if s.get("exclusiveMaximum") != nil {
			hi = g.num(s.get("exclusiveMaximum"), 0) - 1
		}
		return strconv.FormatInt(lo+g.r.Int63n(hi-lo+1), 10)
	case "string":
		switch s.get("format") {
		case "date":
			return `"2024-02-29"`
		case "time":
			return `"23:59:01.123Z"`
		case "date-time":
			return `"1999-12-31T00:00:00+05:30"`
		case "uuid":
			return `"123e4567-e89b-12d3-a456-426614174000"`
		}
		if ex, ok := s.get("examples").([]any); ok {
			return quote(ex[g.r.Intn(len(ex))].(string))
		}
		return quote(g.str(int(g.num(s.get("minLength"), 0)), int(g.num(s.get("maxLength"), 12))))
	case "array":
		if items, ok := s.get("prefixItems").([]any); ok {
			parts := make([]string, len(items))
			for i, it := range items {
				parts[i] = g.value(it.(*omap), depth+1)
			}
			return "[" + strings.Join(parts, ",") + "]"
		}
		lo, hi := g.num(s.get("minItems"), 0), g.num(s.get("maxItems"), 4)
		n := lo + g.r.Int63n(hi-lo+1)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = g.value(s.get("items").(*omap), depth+1)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	// object
	props, _ := s.get("properties").(*omap)
	req := map[string]bool{}
	if r, ok := s.get("required").([]any); ok {
		for _, k := range r {
			req[k.(string)] = true
		}
	}
	// Required properties first, then optional ones, each group in the
	// schema's order: the order llama.cpp's grammars (and ours) impose.
	var parts []string
	if props != nil {
		for _, required := range []bool{true, false} {
			for _, k := range props.keys {
				if req[k] == required && (required || g.r.Intn(2) == 0) {
					parts = append(parts, quote(k)+":"+g.value(props.vals[k].(*omap), depth+1))
				}
			}
		}
	}
	if ap, ok := s.get("additionalProperties").(*omap); ok && g.r.Intn(2) == 0 {
		parts = append(parts, `"extra_`+strconv.Itoa(g.r.Intn(99))+`":`+g.value(ap, depth+1))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// mutate returns a variant of doc that is usually invalid: a character
// dropped, doubled or replaced, a value swapped for another type, a
// property dropped, or spaces added where the grammar allows them.
func mutate(r *rand.Rand, doc string) string {
	if len(doc) < 2 {
		return doc + "x"
	}
	i := r.Intn(len(doc))
	switch r.Intn(7) {
	case 0:
		return doc[:i] + doc[i+1:]
	case 1:
		return doc[:i] + doc[i:i+1] + doc[i:]
	case 2:
		return doc[:i] + string("{}[]\",:0a-"[r.Intn(10)]) + doc[i+1:]
	case 3:
		return strings.Replace(doc, ":", `:"x",`, 1)
	case 4:
		if j := strings.Index(doc, ","); j > 0 {
			k := strings.Index(doc[j+1:], ",")
			if k > 0 {
				return doc[:j] + doc[j+1+k:]
			}
		}
		return doc + " "
	case 5:
		return strings.ReplaceAll(doc, ",", ", ")
	}
	return strings.Replace(doc, "1", "1234567890123456789", 1)
}

// schemaCorpus: hand-written schemas of what clients send (OpenAI
// structured output, pydantic and zod output) and generated ones.
func schemaCorpus() []string {
	c := []string{
		`{"type":"string"}`,
		`{"type":"integer"}`,
		`{"type":"number"}`,
		`{"type":"boolean"}`,
		`{"type":"null"}`,
		`{"type":["string","null"]}`,
		`{"type":["integer","boolean","null"]}`,
		`{"enum":["red","green","blue"]}`,
		`{"enum":["a",1,true,null,"quo\"te"]}`,
		`{"const":"fixed"}`,
		`{"type":"string","minLength":2,"maxLength":5}`,
		`{"type":"string","maxLength":3}`,
		`{"type":"string","minLength":1}`,
		`{"type":"string","format":"date"}`,
		`{"type":"string","format":"time"}`,
		`{"type":"string","format":"date-time"}`,
		`{"type":"string","format":"uuid"}`,
		`{"type":"string","pattern":"^[A-Z]{2}[0-9]{3}$","examples":["AB123","ZZ000","A1234","ab123"]}`,
		`{"type":"string","pattern":"^(foo|bar)+-[a-z]{1,4}$","examples":["foo-a","foobarfoo-abcd","bar-","baz-ab","foo-abcde"]}`,
		`{"type":"string","pattern":"^a?b*c+$","examples":["c","abbc","acc","ab","bbcc"]}`,
		`{"type":"integer","minimum":0,"maximum":120}`,
		`{"type":"integer","minimum":-50,"maximum":50}`,
		`{"type":"integer","minimum":7}`,
		`{"type":"integer","minimum":1234}`,
		`{"type":"integer","maximum":-3}`,
		`{"type":"integer","maximum":999}`,
		`{"type":"integer","minimum":-1000,"maximum":-10}`,
		`{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":1000}`,
		`{"type":"array","items":{"type":"integer"}}`,
		`{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3}`,
		`{"type":"array","items":{"type":"boolean"},"minItems":2}`,
		`{"type":"array","items":{"type":"null"},"maxItems":1}`,
		`{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}]}`,
		`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}`,
		`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}}}`,
		`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"number"},"c":{"type":"boolean"}},"required":["b"]}`,
		`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":{"type":"integer"}}`,
		`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`,
		// OpenAI structured-output style: strict, every property required, nullable by type arrays.
		`{"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":["string","null"]}},"required":["steps","final_answer"],"additionalProperties":false}`,
		// pydantic style: $defs and $ref, anyOf with null, titles.
		`{"$defs":{"Address":{"properties":{"street":{"title":"Street","type":"string"},"zip":{"title":"Zip","type":"string","maxLength":5}},"required":["street","zip"],"title":"Address","type":"object"}},"properties":{"name":{"title":"Name","type":"string"},"address":{"$ref":"#/$defs/Address"},"previous":{"anyOf":[{"$ref":"#/$defs/Address"},{"type":"null"}],"default":null}},"required":["name","address"],"title":"Person","type":"object"}`,
		// zod-to-json-schema style: definitions, additionalProperties false, $schema.
		`{"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"Tag":{"type":"object","properties":{"label":{"type":"string","minLength":1},"weight":{"type":"number"}},"required":["label"],"additionalProperties":false}},"type":"object","properties":{"title":{"type":"string"},"tags":{"type":"array","items":{"$ref":"#/definitions/Tag"},"maxItems":3},"status":{"type":"string","enum":["draft","published"]},"when":{"type":"string","format":"date-time"}},"required":["title","tags","status"],"additionalProperties":false}`,
		// Recursive: a linked list.
		`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"}`,
		`{"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"]},{"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"integer","minimum":1,"maximum":10}},"required":["kind","side"]}]}`,
		`{"type":"object","properties":{"outer":{"type":"object","properties":{"inner":{"type":"object","properties":{"leaf":{"type":"boolean"}},"required":["leaf"]}},"required":["inner"]}}}`,
	}
	// Generated: flat objects of many properties, some required; nested
	// objects; arrays of objects.
	r := rand.New(rand.NewSource(1))
	leaf := func() string {
		return []string{`{"type":"string"}`, `{"type":"integer"}`, `{"type":"boolean"}`, `{"type":"number"}`,
			`{"type":"string","maxLength":8}`, `{"enum":["x","y"]}`, `{"type":["integer","null"]}`,
			`{"type":"integer","minimum":0,"maximum":99}`, `{"type":"array","items":{"type":"integer"},"maxItems":2}`}[r.Intn(9)]
	}
	for _, n := range []int{3, 10, 40} {
		for _, reqFrac := range []int{0, 50, 100} {
			var props, req []string
			for i := range n {
				name := fmt.Sprintf("field_%d", i)
				props = append(props, quote(name)+":"+leaf())
				if r.Intn(100) < reqFrac {
					req = append(req, quote(name))
				}
			}
			c = append(c, `{"type":"object","properties":{`+strings.Join(props, ",")+`},"required":[`+strings.Join(req, ",")+`]}`)
		}
	}
	var nest func(d int) string
	nest = func(d int) string {
		if d == 0 {
			return leaf()
		}
		var props []string
		for i := range 3 {
			props = append(props, fmt.Sprintf(`"n%d_%d":%s`, d, i, nest(d-1)))
		}
		return `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":["n` + strconv.Itoa(d) + `_0"]}`
	}
	c = append(c, nest(2), nest(3), `{"type":"array","items":`+nest(2)+`,"maxItems":2}`)
	for range 40 {
		c = append(c, randomSchema(r, 3))
	}
	return c
}

// randomSchema mixes the keywords the generator and both converters know,
// nested up to depth levels.
func randomSchema(r *rand.Rand, depth int) string {
	k := r.Intn(12)
	if depth == 0 {
		k = r.Intn(7)
	}
	switch k {
	case 0:
		return `{"type":"string"}`
	case 1:
		lo := r.Intn(3)
		return fmt.Sprintf(`{"type":"string","minLength":%d,"maxLength":%d}`, lo, lo+r.Intn(4))
	case 2:
		lo := r.Intn(2000) - 1000
		return fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, lo, lo+r.Intn(5000))
	case 3:
		return []string{`{"type":"number"}`, `{"type":"boolean"}`, `{"type":"null"}`, `{"type":"integer"}`}[r.Intn(4)]
	case 4:
		return []string{`{"enum":["on","off",0,false]}`, `{"const":{"v":[1,"x"]}}`, `{"enum":[1.5,-2,"three"]}`}[r.Intn(3)]
	case 5:
		return []string{`{"type":["string","integer"]}`, `{"type":["boolean","null"]}`}[r.Intn(2)]
	case 6:
		return []string{`{"type":"string","format":"date"}`, `{"type":"string","format":"uuid"}`, `{"type":"integer","minimum":5}`}[r.Intn(3)]
	case 7, 8:
		n := r.Intn(5)
		var props, req []string
		for i := range n {
			props = append(props, fmt.Sprintf(`"k%d":%s`, i, randomSchema(r, depth-1)))
			if r.Intn(2) == 0 {
				req = append(req, fmt.Sprintf(`"k%d"`, i))
			}
		}
		extra := []string{``, `,"additionalProperties":false`, `,"additionalProperties":` + randomSchema(r, 0)}[r.Intn(3)]
		return `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + strings.Join(req, ",") + `]` + extra + `}`
	case 9:
		lo := r.Intn(3)
		return fmt.Sprintf(`{"type":"array","items":%s,"minItems":%d,"maxItems":%d}`, randomSchema(r, depth-1), lo, lo+r.Intn(3))
	case 10:
		return `{"anyOf":[` + randomSchema(r, depth-1) + `,` + randomSchema(r, depth-1) + `]}`
	}
	return `{"type":"array","prefixItems":[` + randomSchema(r, depth-1) + `,` + randomSchema(r, depth-1) + `]}`
}

// TestSchemaGrammarMatchesLlamaCpp converts each schema of the corpus with
// gbnf.SchemaToGrammar and with llama.cpp's converter (the binding), checks
// that llama.cpp parses the Go grammar, and that both grammars accept the
// same of a set of documents: valid ones generated from the schema and
// mutations of them, most of which are invalid.
func TestSchemaGrammarMatchesLlamaCpp(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	var docs, accepted, rejected int
	var goTime, cppTime time.Duration
	for i, schema := range schemaCorpus() {
		t0 := time.Now()
		ours, err := gbnf.SchemaToGrammar([]byte(schema), gbnf.Limits{})
		goTime += time.Since(t0)
		if err != nil {
			t.Fatalf("schema %d: %v\n%s", i, err, schema)
		}
		t0 = time.Now()
		theirs := string(llama.SchemaToGrammar([]byte(schema)))
		cppTime += time.Since(t0)
		if theirs == "" {
			t.Fatalf("schema %d: llama.cpp does not convert it\n%s", i, schema)
		}
		gen := &docGen{root: decodeOrdered(t, schema).(*omap), r: r, t: t}
		for range 12 {
			valid := gen.value(gen.root, 0)
			for k, doc := range []string{valid, mutate(r, valid), mutate(r, valid), mutate(r, mutate(r, valid))} {
				a, b := llamaAccepts(t, ours, doc), llamaAccepts(t, theirs, doc)
				docs++
				if a != b {
					t.Errorf("schema %d: document %s: ours accepts %v, llama.cpp's %v\nschema: %s\nours:\n%s\ntheirs:\n%s", i, doc, a, b, schema, ours, theirs)
					return
				}
				if k == 0 && !a && !isExampleMismatch(schema, doc) {
					t.Errorf("schema %d: generated document %s is refused by both\n%s", i, doc, ours)
				}
				if a {
					accepted++
				} else {
					rejected++
				}
			}
		}
	}
	t.Logf("%d schemas, %d documents (%d accepted, %d refused by both); conversion: Go %v, llama.cpp %v", len(schemaCorpus()), docs, accepted, rejected, goTime, cppTime)
}

// TestSchemaGrammarMatchesLlamaCppOnChosenDocuments: documents written for
// the corners the generator rarely reaches (names that are prefixes of
// other names under additionalProperties, escapes, numbers at the edges of
// integer ranges).
func TestSchemaGrammarMatchesLlamaCppOnChosenDocuments(t *testing.T) {
	cases := []struct {
		schema string
		docs   []string
	}{
		{`{"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"integer"},"abc":{"type":"string"}},"additionalProperties":{"type":"boolean"}}`,
			[]string{`{"ab":true}`, `{"a":true}`, `{"abc":true}`, `{"abd":true}`, `{"b":false}`, `{"":true}`, `{"a":1,"ab":2,"x":true,"y":false}`, `{"a":1,"abcd":true}`, `{"ab":1,"a":2}`}},
		{`{"type":"integer","minimum":-105,"maximum":2001}`,
			[]string{`-105`, `-106`, `-100`, `-0`, `0`, `2001`, `2002`, `1999`, `999`, `0999`, `10000`}},
		{`{"type":"integer","minimum":17}`, []string{`16`, `17`, `99`, `100`, `9`, `1000000`, `-1`}},
		{`{"type":"integer","maximum":-17}`, []string{`-16`, `-17`, `-100`, `0`, `-9`}},
		{`{"enum":["a\"b","c\\d","tab\t","é"]}`, []string{`"a\"b"`, `"c\\d"`, `"tab\t"`, `"é"`, `"\u00e9"`, `"ab"`}},
		{`{"type":"object","properties":{"x":{"type":"string","minLength":2,"maxLength":3}},"required":["x"]}`,
			[]string{`{"x":"a"}`, `{"x":"ab"}`, `{"x":"abc"}`, `{"x":"abcd"}`, `{"x":"\n\u1234"}`, `{ "x" : "ab" }`, `{"x":"ab"} `}},
	}
	for _, c := range cases {
		ours, err := gbnf.SchemaToGrammar([]byte(c.schema), gbnf.Limits{})
		if err != nil {
			t.Fatalf("%s: %v", c.schema, err)
		}
		theirs := string(llama.SchemaToGrammar([]byte(c.schema)))
		for _, doc := range c.docs {
			if a, b := llamaAccepts(t, ours, doc), llamaAccepts(t, theirs, doc); a != b {
				t.Errorf("%s: document %s: ours accepts %v, llama.cpp's %v\nours:\n%s\ntheirs:\n%s", c.schema, doc, a, b, ours, theirs)
			}
		}
	}
}

// isExampleMismatch: the corpus's pattern schemas list non-matching
// examples on purpose, so their refusal by both is expected.
func isExampleMismatch(schema, doc string) bool {
	return strings.Contains(schema, `"examples"`) || bytes.Contains([]byte(doc), []byte("1234567890123456789"))
}

// TestSchemaGenerationMatchesSchema: the real model generating under each
// corpus schema (through the engine, so with the Go converter's grammar)
// writes JSON that llama.cpp's own converter's grammar accepts whenever the
// reply ends on its own.
func TestSchemaGenerationMatchesSchema(t *testing.T) {
	e, err := Open(Config{Path: testmodel.Path(t), ContextLength: 512, Parallel: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompt, err := e.Tokenize("Once upon a time")
	if err != nil {
		t.Fatal(err)
	}
	ended, tried := 0, 0
	for i, schema := range schemaCorpus() {
		if i%3 != 0 && i < 40 {
			continue // a third of the hand-written ones and every generated one keep the test short
		}
		t0 := time.Now()
		for _, seed := range []int64{1} {
			tried++
			p := parley.DefaultParams()
			p.MaxTokens, p.Seed, p.Temperature = 120, seed, 0.7
			p.JSONSchema = json.RawMessage(schema)
			ch, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: prompt, Params: p})
			if err != nil {
				t.Fatalf("schema %d: %v", i, err)
			}
			var text strings.Builder
			var final parley.Event
			for ev := range ch {
				if ev.Done {
					final = ev
					continue
				}
				text.WriteString(ev.Token.Text)
			}
			if final.Err != nil {
				t.Fatalf("schema %d: %v", i, final.Err)
			}
			if final.Finish != parley.FinishEOS {
				continue // cut at the cap: nothing to check as a whole
			}
			ended++
			out := text.String()
			if !json.Valid([]byte(out)) {
				t.Errorf("schema %d: reply %q is not JSON", i, out)
			}
			if !llamaAccepts(t, string(llama.SchemaToGrammar([]byte(schema))), out) {
				t.Errorf("schema %d: reply %q does not match the schema (llama.cpp's grammar refuses it)\n%s", i, out, schema)
			}
		}
		if d := time.Since(t0); d > time.Second {
			t.Logf("schema %d: two replies took %v", i, d)
		}
	}
	if ended < tried/2 {
		t.Errorf("only %d of %d replies ended on their own", ended, tried)
	}
	t.Logf("%d of %d replies ended on their own and match their schema", ended, tried)
}

// TestSchemaConversionSpeed compares the Go converter with the binding's on
// a 500-property schema, and shows the binding's output cut short.
func TestSchemaConversionSpeed(t *testing.T) {
	var props []string
	for i := range 500 {
		props = append(props, fmt.Sprintf(`"customer_record_field_number_%d":{"type":"string","maxLength":40,"description":"Field %d."}`, i, i))
	}
	schema := []byte(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`)
	best := func(f func()) time.Duration {
		var b time.Duration
		for k := range 5 {
			t0 := time.Now()
			f()
			if d := time.Since(t0); k == 0 || d < b {
				b = d
			}
		}
		return b
	}
	var ours string
	goTime := best(func() {
		var err error
		if ours, err = gbnf.SchemaToGrammar(schema, gbnf.Limits{}); err != nil {
			t.Fatal(err)
		}
	})
	var theirs []byte
	cppTime := best(func() { theirs = llama.SchemaToGrammar(schema) })
	g := llama.NewGrammar(ours, []uint32{0}, []string{""}, []int32{0})
	if g == nil {
		t.Fatal("llama.cpp does not parse the Go grammar")
	}
	g.Free()
	cut := gbnf.Check(string(theirs), gbnf.Limits{MaxBytes: 1 << 20}) != nil
	t.Logf("500 properties (%d-byte schema): Go %v (%d-byte grammar, checked); binding %v (%d bytes, cut short: %v)", len(schema), goTime, len(ours), cppTime, len(theirs), cut)
	if !cut {
		t.Log("the binding's grammar was not cut short: its buffer limit changed?")
	}
}
