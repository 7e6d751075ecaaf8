package gbnf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
)

// Limits on a JSON schema that SchemaToGrammar converts. Each is checked as
// the schema is read or converted, so a schema over one is refused in time
// linear in the part read so far.
const (
	// MaxSchemaNodes bounds the JSON values (objects, arrays, strings,
	// numbers, ...) in a schema: about 5 per typical property.
	MaxSchemaNodes = 20_000
	// MaxSchemaProperties bounds the properties of one object schema.
	// Optional properties become one alternative each where the object
	// starts (llama.cpp's shape), and the grammar check allows 1,024 ways
	// to continue from one place.
	MaxSchemaProperties = 1000
	// MaxSchemaNesting bounds the nesting of objects and arrays in a schema.
	MaxSchemaNesting = 64
	// MaxSchemaGrammar bounds the converted grammar in bytes.
	MaxSchemaGrammar = 1 << 20
	// maxSchemaVisits bounds the sub-schemas converted: a type array
	// converts its schema once per type, so nested type arrays multiply.
	maxSchemaVisits = 4 * MaxSchemaNodes
	// maxSafeInteger is 2^53-1, JavaScript's Number.MAX_SAFE_INTEGER:
	// clients (zod, pydantic) write ±it, or ±Number.MAX_VALUE, for "no
	// bound"; an integer bound this large or larger is none.
	maxSafeInteger = 1<<53 - 1
)

// Rules every converted grammar may share, as llama.cpp's converter writes
// them (json-schema-to-grammar.cpp), so that both accept the same documents.
var primitiveRules = map[string]struct {
	body string
	deps []string
}{
	"space":            {`| " " | "\n"{1,2} [ \t]{0,20}`, nil},
	"boolean":          {`("true" | "false") space`, []string{"space"}},
	"decimal-part":     {`[0-9]{1,16}`, nil},
	"integral-part":    {`[0] | [1-9] [0-9]{0,15}`, nil},
	"number":           {`("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space`, []string{"integral-part", "decimal-part", "space"}},
	"integer":          {`("-"? integral-part) space`, []string{"integral-part", "space"}},
	"value":            {`object | array | string | number | boolean | null`, []string{"object", "array", "string", "number", "boolean", "null"}},
	"object":           {`"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space`, []string{"string", "value", "space"}},
	"array":            {`"[" space ( value ("," space value)* )? "]" space`, []string{"value", "space"}},
	"uuid":             {`"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space`, []string{"space"}},
	"char":             {`[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})`, nil},
	"string":           {`"\"" char* "\"" space`, []string{"char", "space"}},
	"null":             {`"null" space`, []string{"space"}},
	"date":             {`[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )`, nil},
	"time":             {`([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )`, nil},
	"date-time":        {`date "T" time`, []string{"date", "time"}},
	"date-string":      {`"\"" date "\"" space`, []string{"date", "space"}},
	"time-string":      {`"\"" time "\"" space`, []string{"time", "space"}},
	"date-time-string": {`"\"" date-time "\"" space`, []string{"date-time", "space"}},
	// pattern-dot is a regular expression's "." inside a JSON string: any
	// character but a line break, written as JSON writes it.
	"pattern-dot": {`[^"\\\x7F\x00-\x1F] | "\\" ["\\/bft]`, nil},
}

// conversions counts SchemaToGrammar's calls in this process. It only
// grows, like an expvar counter; see Conversions.
var conversions atomic.Int64

// Conversions reports how many schemas SchemaToGrammar has been asked to
// convert in this process. A large schema takes ~100 ms to convert, so a
// request's is converted once (by parley.Params.Validate); tests use this
// to hold it to that.
func Conversions() int64 { return conversions.Load() }

type converter struct {
	root   *jnode
	names  []string          // rule names in the order they were defined
	bodies map[string]string // rule name -> body
	shared map[string]string // body -> the rule name first defined with it
	next   map[string]int    // name base -> next suffix to try
	refs   map[string]string // $ref -> its rule name
	size   int               // bytes of grammar so far
	visits int
}

// SchemaToGrammar converts a JSON schema to a GBNF grammar whose root
// matches the JSON documents the schema describes, as llama.cpp's converter
// does (same shapes, same shared rules), then checks the grammar with Check
// under lim. It refuses, with an *Error naming the schema path, what it
// cannot convert faithfully and anything over the limits above.
//
// Where it differs from llama.cpp: an empty schema ({} or true) is any JSON
// value (llama.cpp: any object); allOf honours each part's "required"
// (llama.cpp: every property of a part is required) and refuses parts it
// cannot merge (llama.cpp drops them); a pattern's characters are written
// as JSON writes them (a quote as \", a backslash as \\), and it knows \d, \w,
// \s and (?:...); lone UTF-16 surrogates are refused. Number bounds are not
// enforced (neither does llama.cpp); integer bounds are, exactly, with the
// same digit-range rules as llama.cpp.
func SchemaToGrammar(raw []byte, lim Limits) (string, error) {
	conversions.Add(1)
	root, err := parseJSON(string(raw), MaxSchemaNodes, MaxSchemaNesting)
	if err != nil {
		return "", err
	}
	c := &converter{
		root:   root,
		bodies: map[string]string{},
		shared: map[string]string{},
		next:   map[string]int{},
		refs:   map[string]string{},
	}
	c.names = append(c.names, "root") // defined last, printed first
	c.bodies["root"] = ""
	c.primitive("space") // nearly every rule ends with it
	top, err := c.convert(root)
	if err != nil {
		return "", err
	}
	c.bodies["root"] = top
	var b strings.Builder
	b.Grow(c.size + len(top) + 16)
	for _, name := range c.names {
		b.WriteString(name)
		b.WriteString(" ::= ")
		b.WriteString(c.bodies[name])
		b.WriteByte('\n')
	}
	g := b.String()
	if len(g) > MaxSchemaGrammar {
		return "", &Error{Msg: fmt.Sprintf("converts to a grammar over %d bytes (limit on schema size)", MaxSchemaGrammar)}
	}
	if lim.MaxBytes < MaxSchemaGrammar {
		lim.MaxBytes = MaxSchemaGrammar
	}
	if err := Check(g, lim); err != nil {
		return "", fmt.Errorf("converts to a grammar that is refused: %w", err)
	}
	return g, nil
}

// convert runs visit, turning its panics into errors.
func (c *converter) convert(root *jnode) (name string, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			name, err = "", b.err
		}
	}()
	return c.visit(root, "", "root", ""), nil
}

func (c *converter) fail(path, format string, args ...any) {
	if len(path) > 120 { // deep schemas: the end of the path says where
		path = "..." + path[len(path)-117:]
	}
	panic(bail{schemaErr(path, format, args...).(*Error)})
}

// ruleName turns a hint (a property name, say) into a rule name llama.cpp
// accepts: [a-zA-Z0-9-], at most 28 bytes so that names do not make up
// most of a large grammar (fresh adds a suffix where two collide).
func ruleName(hint string) string {
	var b strings.Builder
	dash := false
	for _, r := range hint {
		if r < 128 && isWord(byte(r)) && r != '-' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= 28 {
			break
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if s == "" {
		s = "r"
	}
	return s
}

// addRule defines a rule with body and returns its name. A body already
// defined returns the rule that has it, so equal sub-schemas share one rule.
func (c *converter) addRule(hint, body string) string {
	if name, ok := c.shared[body]; ok {
		return name
	}
	name := c.fresh(hint)
	c.define(name, body)
	return name
}

// fresh returns an unused rule name made from hint.
func (c *converter) fresh(hint string) string {
	base := ruleName(hint)
	name := base
	if _, used := c.bodies[name]; used || isPrimitive(name) {
		for {
			c.next[base]++
			name = base + "-" + strconv.Itoa(c.next[base])
			if _, used := c.bodies[name]; !used && !isPrimitive(name) {
				break
			}
		}
	}
	c.bodies[name] = "" // reserved
	return name
}

func isPrimitive(name string) bool {
	_, ok := primitiveRules[name]
	return ok || name == "root"
}

func (c *converter) define(name, body string) {
	if _, seen := c.bodies[name]; !seen || c.bodies[name] == "" {
		c.names = append(c.names, name)
	}
	c.bodies[name] = body
	if _, ok := c.shared[body]; !ok {
		c.shared[body] = name
	}
	c.size += len(name) + len(body) + 6
	if c.size > MaxSchemaGrammar {
		c.fail("", "converts to a grammar over %d bytes (limit on schema size)", MaxSchemaGrammar)
	}
}

// primitive defines a built-in rule and the rules it uses, once.
func (c *converter) primitive(name string) string {
	if _, ok := c.bodies[name]; ok {
		return name
	}
	p := primitiveRules[name]
	c.bodies[name] = ""
	for _, d := range p.deps {
		c.primitive(d)
	}
	c.define(name, p.body)
	return name
}

// typeOf returns the schema's single type, or "" when it has none.
func typeOf(n *jnode, override string) string {
	if override != "" {
		return override
	}
	if t := n.get("type"); t != nil && t.kind == 's' {
		return t.str
	}
	return ""
}

// visit converts schema n at path into a rule and returns the rule's name.
// override stands for n's "type" when n's type array is being split.
func (c *converter) visit(n *jnode, path, hint, override string) string {
	if c.visits++; c.visits > maxSchemaVisits {
		c.fail(path, "converts more than %d sub-schemas (type arrays multiply; limit on schema size)", maxSchemaVisits)
	}
	switch n.kind {
	case 'b':
		if n.b {
			return c.primitive("value")
		}
		c.fail(path, "schema false matches nothing")
	case 'o':
	default:
		c.fail(path, "a schema must be an object or a boolean")
	}
	typ := typeOf(n, override)
	if t := n.get("type"); t != nil && override == "" && t.kind != 's' && t.kind != 'a' {
		c.fail(join(path, "type"), "must be a string or an array of strings")
	}
	switch {
	case n.has("$ref"):
		return c.ref(n.get("$ref"), join(path, "$ref"))
	case n.has("oneOf") || n.has("anyOf"):
		key := "anyOf"
		if n.has("oneOf") {
			key = "oneOf"
		}
		alts := n.get(key)
		if alts.kind != 'a' || len(alts.vals) == 0 {
			c.fail(join(path, key), "must be a non-empty array of schemas")
		}
		parts := make([]string, len(alts.vals))
		for i, a := range alts.vals {
			parts[i] = c.visit(a, fmt.Sprintf("%s[%d]", join(path, key), i), hint, "")
		}
		return c.addRule(hint, strings.Join(parts, " | "))
	case override == "" && n.get("type") != nil && n.get("type").kind == 'a':
		types := n.get("type")
		if len(types.vals) == 0 {
			c.fail(join(path, "type"), "is an empty array: nothing can match")
		}
		parts := make([]string, len(types.vals))
		for i, t := range types.vals {
			if t.kind != 's' {
				c.fail(join(path, "type"), "must be a string or an array of strings")
			}
			parts[i] = c.visit(n, path, hint+"-"+t.str, t.str)
		}
		return c.addRule(hint, strings.Join(parts, " | "))
	case n.has("const"):
		return c.addRule(hint, c.literalValue(n.get("const"), join(path, "const"))+" space")
	case n.has("enum"):
		e := n.get("enum")
		if e.kind != 'a' || len(e.vals) == 0 {
			c.fail(join(path, "enum"), "must be a non-empty array")
		}
		parts := make([]string, len(e.vals))
		for i, v := range e.vals {
			parts[i] = c.literalValue(v, fmt.Sprintf("%s[%d]", join(path, "enum"), i))
		}
		c.primitive("space")
		return c.addRule(hint, "("+strings.Join(parts, " | ")+") space")
	case (typ == "" || typ == "object") && (n.has("properties") || n.has("additionalProperties") && !isTrue(n.get("additionalProperties"))):
		return c.addRule(hint, c.object(n, path, hint))
	case (typ == "" || typ == "object" || typ == "string") && n.has("allOf"):
		return c.allOf(n, path, hint)
	case (typ == "" || typ == "array") && (n.has("items") || n.has("prefixItems")):
		return c.array(n, path, hint)
	case (typ == "" || typ == "string") && n.has("pattern"):
		return c.pattern(n.get("pattern"), join(path, "pattern"), hint)
	case (typ == "" || typ == "string") && isUUIDFormat(n.get("format")):
		return c.primitive("uuid")
	case (typ == "" || typ == "string") && isDateFormat(n.get("format")):
		return c.primitive(n.get("format").str + "-string")
	case typ == "string" && (n.has("minLength") || n.has("maxLength")):
		lo, hi := c.bound(n, "minLength", path, 0), c.bound(n, "maxLength", path, -1)
		c.primitive("char")
		c.primitive("space")
		return c.addRule(hint, `"\"" `+repetition("char", lo, hi, "")+` "\"" space`)
	case typ == "integer" && (n.has("minimum") || n.has("exclusiveMinimum") || n.has("maximum") || n.has("exclusiveMaximum")):
		lo, hi, ok := integerBounds(n, path, c)
		if !ok {
			return c.primitive("integer")
		}
		var b strings.Builder
		b.WriteString("(")
		intRange(&b, lo, hi, 16, true)
		b.WriteString(") space")
		c.primitive("space")
		return c.addRule(hint, b.String())
	case typ == "":
		return c.primitive("value")
	}
	switch typ {
	case "object", "array", "string", "number", "integer", "boolean", "null":
		return c.primitive(typ)
	}
	c.fail(join(path, "type"), "unknown type %q", typ)
	return ""
}

func isTrue(n *jnode) bool { return n.kind == 'b' && n.b }

func isUUIDFormat(f *jnode) bool {
	if f == nil || f.kind != 's' {
		return false
	}
	return f.str == "uuid" || len(f.str) == 5 && strings.HasPrefix(f.str, "uuid") && f.str[4] >= '1' && f.str[4] <= '5'
}

func isDateFormat(f *jnode) bool {
	return f != nil && f.kind == 's' && (f.str == "date" || f.str == "time" || f.str == "date-time")
}

// literalValue returns the GBNF literal of v written as JSON.
func (c *converter) literalValue(v *jnode, path string) string {
	var b strings.Builder
	if err := dumpJSON(&b, v); err != nil {
		c.fail(path, "%v", err)
	}
	return Literal(b.String())
}

// Literal writes s as a GBNF string literal. Code points outside printable
// ASCII are escaped, so the grammar's bytes never depend on the input's.
func Literal(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r >= 0x20 && r < 0x7F:
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		default:
			writeEscaped(&b, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func writeEscaped(b *strings.Builder, r rune) {
	switch {
	case r < 0x100:
		fmt.Fprintf(b, `\x%02X`, r)
	case r < 0x10000:
		fmt.Fprintf(b, `\u%04X`, r)
	default:
		fmt.Fprintf(b, `\U%08X`, r)
	}
}

// writeClassChar writes r for use inside [...]: letters and digits as they
// are, everything else escaped (GBNF has no \- or \^).
func writeClassChar(b *strings.Builder, r rune) {
	if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
		b.WriteRune(r)
		return
	}
	writeEscaped(b, r)
}

// bound reads a length or item count; def when absent (-1: no maximum).
// A maximum (def -1) above the grammar's repetition cap is no maximum: a
// grammar cannot count that far, and a bound that large (Claude Code's
// maxLength 524288) says "long", not "at most so many"; the model is free
// to write less. A minimum above the cap cannot be enforced and is refused.
func (c *converter) bound(n *jnode, key, path string, def int) int {
	v := n.get(key)
	if v == nil {
		return def
	}
	f, err := strconv.ParseFloat(v.str, 64)
	if v.kind != 'n' || err != nil || f < 0 || f != math.Trunc(f) {
		c.fail(join(path, key), "must be a non-negative integer")
	}
	if f > float64(defaultLimits().MaxRepeat) {
		if def < 0 {
			return -1
		}
		c.fail(join(path, key), "is over %d", defaultLimits().MaxRepeat)
	}
	return int(f)
}

// repetition writes item repeated lo to hi times (hi < 0: no maximum), with
// sep between the items, as llama.cpp's build_repetition does.
func repetition(item string, lo, hi int, sep string) string {
	if hi == 0 {
		return ""
	}
	if lo == 0 && hi == 1 {
		return item + "?"
	}
	if sep == "" {
		switch {
		case lo == 1 && hi < 0:
			return item + "+"
		case lo == 0 && hi < 0:
			return item + "*"
		case hi < 0:
			return fmt.Sprintf("%s{%d,}", item, lo)
		default:
			return fmt.Sprintf("%s{%d,%d}", item, lo, hi)
		}
	}
	restHi := hi
	if hi > 0 {
		restHi = hi - 1
	}
	res := item + " " + repetition("("+sep+" "+item+")", max(lo-1, 0), restHi, "")
	if lo == 0 {
		res = "(" + res + ")?"
	}
	return res
}

// ref converts a local $ref ("#", "#/$defs/x", "#/definitions/x", any JSON
// pointer into the schema). A reference seen before, or being converted
// (recursion), is the same rule.
func (c *converter) ref(v *jnode, path string) string {
	if v.kind != 's' {
		c.fail(path, "must be a string")
	}
	ref := v.str
	if name, ok := c.refs[ref]; ok {
		return name
	}
	if !strings.HasPrefix(ref, "#") {
		c.fail(path, "%q is not supported: only references inside the schema (#/...)", ref)
	}
	target := c.resolve(ref, path)
	name := c.fresh("ref-" + ref[strings.LastIndexByte(ref, '/')+1:])
	c.refs[ref] = name
	// Errors inside the target name its place in the schema, not the
	// first reference to it.
	body := c.visit(target, strings.ReplaceAll(strings.TrimPrefix(ref[1:], "/"), "/", "."), name+"-def", "")
	c.define(name, body)
	return name
}

// resolve follows a local JSON pointer.
func (c *converter) resolve(ref, path string) *jnode {
	target := c.root
	if ptr := ref[1:]; ptr != "" {
		if ptr[0] != '/' {
			c.fail(path, "%q is not a JSON pointer", ref)
		}
		for _, tok := range strings.Split(ptr[1:], "/") {
			tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
			if target.kind == 'a' {
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(target.vals) {
					c.fail(path, "%q does not resolve: no %q", ref, tok)
				}
				target = target.vals[i]
				continue
			}
			target = target.get(tok)
			if target == nil {
				c.fail(path, "%q does not resolve: no %q", ref, tok)
			}
		}
	}
	return target
}

// array converts items (one schema, with minItems/maxItems), or a tuple
// (items as an array, or prefixItems).
func (c *converter) array(n *jnode, path, hint string) string {
	c.primitive("space")
	key := "items"
	items := n.get("items")
	if pre := n.get("prefixItems"); pre != nil && (items == nil || items.kind == 'b') {
		// A tuple (draft 2020-12); "items": false, its usual companion,
		// says no more items follow, which a tuple rule says already.
		key, items = "prefixItems", pre
	}
	if items.kind == 'b' && !items.b {
		return c.addRule(hint, `"[" space "]" space`)
	}
	if items.kind == 'a' {
		var b strings.Builder
		b.WriteString(`"[" space `)
		for i, it := range items.vals {
			if i > 0 {
				b.WriteString(` "," space `)
			}
			b.WriteString(c.visit(it, fmt.Sprintf("%s[%d]", join(path, key), i), hint+"-tuple-"+strconv.Itoa(i), ""))
		}
		b.WriteString(` "]" space`)
		return c.addRule(hint, b.String())
	}
	item := c.visit(items, join(path, key), hint+"-item", "")
	lo, hi := c.bound(n, "minItems", path, 0), c.bound(n, "maxItems", path, -1)
	return c.addRule(hint, `"[" space `+repetition(item, lo, hi, `"," space`)+` "]" space`)
}

// integerBounds reads an integer schema's bounds. ok is false when neither
// is a bound (each is absent or at least 2^53-1 in size).
func integerBounds(n *jnode, path string, c *converter) (lo, hi int64, ok bool) {
	lo, hi = math.MinInt64, math.MaxInt64
	read := func(key string) (float64, bool) {
		v := n.get(key)
		if v == nil {
			return 0, false
		}
		f, err := strconv.ParseFloat(v.str, 64)
		if v.kind != 'n' || err != nil && !strings.Contains(err.Error(), "range") {
			c.fail(join(path, key), "must be a number")
		}
		return f, true
	}
	for _, key := range []string{"minimum", "exclusiveMinimum"} {
		f, present := read(key)
		if !present || f <= -maxSafeInteger {
			continue
		}
		if f >= maxSafeInteger {
			c.fail(join(path, key), "is over 2^53-1: no integer is that large")
		}
		b := int64(math.Ceil(f))
		if key == "exclusiveMinimum" && float64(b) == f {
			b++
		}
		lo = max(lo, b)
	}
	for _, key := range []string{"maximum", "exclusiveMaximum"} {
		f, present := read(key)
		if !present || f >= maxSafeInteger {
			continue
		}
		if f <= -maxSafeInteger {
			c.fail(join(path, key), "is under -(2^53-1): no integer is that small")
		}
		b := int64(math.Floor(f))
		if key == "exclusiveMaximum" && float64(b) == f {
			b--
		}
		hi = min(hi, b)
	}
	if lo > hi {
		c.fail(path, "no integer lies between the minimum and the maximum")
	}
	return lo, hi, lo != math.MinInt64 || hi != math.MaxInt64
}
