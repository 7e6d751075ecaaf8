package chat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A lexer and parser for the inside of a Jinja tag, with jinja2's grammar and precedence. prepareSource parses
// each tag with them and writes it back (emit.go) in the engine's syntax, fully parenthesized, with helpers where
// the engine's semantics differ from Python's.

type tokKind uint8

const (
	tkName tokKind = iota
	tkString
	tkInt
	tkFloat
	tkOp
	tkEOF
)

type token struct {
	kind tokKind
	text string // the name, the operator, or the number as written
	str  string // a string literal's value
	num  float64
	n    int64
}

// errTemplateSyntax is a template jinja2 refuses to compile.
var errTemplateSyntax = errors.New("template syntax error")

func syntaxErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errTemplateSyntax, fmt.Sprintf(format, args...))
}

// isPySpace is Python's str.isspace for one character (the whitespace jinja2's \s and rstrip() remove).
func isPySpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// stringEnd returns the index just past the string literal that opens at s[i] (a quote), skipping backslash
// escapes; -1 when it does not close.
func stringEnd(s string, i int) int {
	quote := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case quote:
			return j + 1
		}
	}
	return -1
}

// twoCharOps and oneCharOps are jinja2's operators, longest first.
var twoCharOps = []string{"//", "**", "==", "!=", ">=", "<="}

const oneCharOps = "+-/*%~[](){}><=.:|,;"

// lexTag reads the tokens of the tag whose inside starts at src[from], up to its closer ("}}" or "%}") outside
// brackets, as jinja2's lexer does. It returns the tokens, the index of the closer's first byte (its sign included:
// "-" or "+" just before it) and the sign.
func lexTag(src string, from int, closer string) (toks []token, end int, sign byte, err error) {
	var stack []byte
	i := from
	for {
		for i < len(src) {
			r, size := utf8.DecodeRuneInString(src[i:])
			if !isPySpace(r) {
				break
			}
			i += size
		}
		if i >= len(src) {
			return nil, 0, 0, syntaxErr("unexpected end of template, the tag is not closed")
		}
		if len(stack) == 0 {
			if strings.HasPrefix(src[i:], closer) {
				return toks, i, 0, nil
			}
			if (src[i] == '-' || (src[i] == '+' && closer == "%}")) && strings.HasPrefix(src[i+1:], closer) {
				return toks, i, src[i], nil
			}
		}
		c := src[i]
		switch {
		case c == '\'' || c == '"':
			j := stringEnd(src, i)
			if j < 0 {
				return nil, 0, 0, syntaxErr("unexpected char %q", c)
			}
			toks = append(toks, token{kind: tkString, str: pyUnescape(src[i+1 : j-1])})
			i = j
		case c >= '0' && c <= '9':
			t, j, err := lexNumber(src, i)
			if err != nil {
				return nil, 0, 0, err
			}
			toks = append(toks, t)
			i = j
		case c == '_' || c >= 0x80 || unicode.IsLetter(rune(c)):
			j := i
			for j < len(src) {
				r, size := utf8.DecodeRuneInString(src[j:])
				if r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
					break
				}
				j += size
			}
			if j == i {
				return nil, 0, 0, syntaxErr("unexpected char %q", src[i:i+1])
			}
			toks = append(toks, token{kind: tkName, text: src[i:j]})
			i = j
		default:
			op := ""
			for _, o := range twoCharOps {
				if strings.HasPrefix(src[i:], o) {
					op = o
					break
				}
			}
			if op == "" && strings.IndexByte(oneCharOps, c) >= 0 {
				op = src[i : i+1]
			}
			if op == "" {
				return nil, 0, 0, syntaxErr("unexpected char %q", c)
			}
			switch op {
			case "(", "[", "{":
				if len(stack) >= maxSourceNesting {
					return nil, 0, 0, fmt.Errorf("%w: a tag nests brackets more than %d deep", errRecursion, maxSourceNesting)
				}
				stack = append(stack, map[string]byte{"(": ')', "[": ']', "{": '}'}[op])
			case ")", "]", "}":
				if len(stack) == 0 {
					return nil, 0, 0, syntaxErr("unexpected '%s'", op)
				}
				if want := stack[len(stack)-1]; want != op[0] {
					return nil, 0, 0, syntaxErr("unexpected '%s', expected '%c'", op, want)
				}
				stack = stack[:len(stack)-1]
			}
			toks = append(toks, token{kind: tkOp, text: op})
			i += len(op)
		}
	}
}

// lexNumber reads an integer or a float as jinja2 does (underscores between digits, an exponent).
func lexNumber(src string, i int) (token, int, error) {
	digits := func(j int) int {
		for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_' && j+1 < len(src) && src[j+1] >= '0' && src[j+1] <= '9') {
			j++
		}
		return j
	}
	j := digits(i)
	isFloat := false
	if j+1 < len(src) && src[j] == '.' && src[j+1] >= '0' && src[j+1] <= '9' {
		j = digits(j + 1)
		isFloat = true
	}
	if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
		k := j + 1
		if k < len(src) && (src[k] == '+' || src[k] == '-') {
			k++
		}
		if k < len(src) && src[k] >= '0' && src[k] <= '9' {
			j = digits(k)
			isFloat = true
		}
	}
	text := strings.ReplaceAll(src[i:j], "_", "")
	if isFloat {
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return token{}, 0, syntaxErr("bad number %q", src[i:j])
		}
		return token{kind: tkFloat, text: text, num: f}, j, nil
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return token{}, 0, syntaxErr("integer %q out of range", src[i:j])
	}
	return token{kind: tkInt, text: text, n: n}, j, nil
}

// pyUnescape is a string literal's value as jinja2 reads it (Python's unicode-escape: \n, \t, \\, \', \x41,
// \u00e9, octal; an unknown escape stays as written).
func pyUnescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		c := s[i]
		switch c {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '\\', '\'', '"':
			b.WriteByte(c)
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
			if i+1+n <= len(s) {
				if v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32); err == nil {
					b.WriteRune(rune(v))
					i += n
					continue
				}
			}
			b.WriteByte('\\')
			b.WriteByte(c)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(s[i:j], 8, 32)
			b.WriteRune(rune(v))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	return b.String()
}

// The expression tree, as jinja2's parser builds it.
type (
	jNode  interface{}
	jName  struct{ name string }
	jConst struct{ v any } // string, int64, float64, bool, or nil (None)
	jList  struct {
		items []jNode
		tuple bool
	}
	jDict struct{ keys, vals []jNode }
	jAttr struct {
		obj  jNode
		name string
	}
	jItem  struct{ obj, key jNode }
	jSlice struct{ start, stop, step jNode }
	jArgs  struct {
		args     []jNode
		kwNames  []string
		kwVals   []jNode
		dyn, dkw jNode // *args and **kwargs
	}
	jCall struct {
		fn jNode
		jArgs
	}
	jFilter struct {
		obj  jNode // nil in a filter block
		name string
		jArgs
	}
	jTest struct {
		obj  jNode
		name string
		neg  bool
		jArgs
	}
	jBin struct {
		op   string
		l, r jNode
	}
	jCompare struct {
		first jNode
		ops   []string
		rest  []jNode
	}
	jConcat struct{ items []jNode }
	jUnary  struct {
		op string
		x  jNode
	}
	jCond struct{ then, cond, els jNode }
)

// parser reads one tag's tokens.
type parser struct {
	toks  []token
	pos   int
	depth int
	names map[string]bool // every name the tag reads
}

func newParser(toks []token) *parser {
	return &parser{toks: append(toks, token{kind: tkEOF}), names: map[string]bool{}}
}

func (p *parser) cur() token { return p.toks[p.pos] }

func (p *parser) look() token {
	if p.pos+1 < len(p.toks) {
		return p.toks[p.pos+1]
	}
	return token{kind: tkEOF}
}

func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tkEOF {
		p.pos++
	}
	return t
}

func (p *parser) isOp(op string) bool   { t := p.cur(); return t.kind == tkOp && t.text == op }
func (p *parser) isName(n string) bool  { t := p.cur(); return t.kind == tkName && t.text == n }
func (p *parser) atEnd() bool           { return p.cur().kind == tkEOF }
func (p *parser) skipOp(op string) bool { return p.isOp(op) && p.next().kind == tkOp }
func (p *parser) skipName(n string) bool {
	if p.isName(n) {
		p.next()
		return true
	}
	return false
}

func (p *parser) expectOp(op string) error {
	if !p.skipOp(op) {
		return syntaxErr("expected '%s', got %s", op, p.describe())
	}
	return nil
}

func (p *parser) describe() string {
	t := p.cur()
	switch t.kind {
	case tkEOF:
		return "end of statement"
	case tkString:
		return strconv.Quote(t.str)
	}
	return "'" + t.text + "'"
}

// enter bounds the parser's recursion (jinja2's own parser raises RecursionError on deep nesting).
func (p *parser) enter() error {
	p.depth++
	if p.depth > 4*maxSourceNesting {
		return fmt.Errorf("%w: an expression nests more than %d levels", errRecursion, maxSourceNesting)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

// parseTuple is jinja2's parse_tuple: an expression, or several separated by commas (a tuple).
func (p *parser) parseTuple(condexpr bool) (jNode, error) {
	var items []jNode
	tuple := false
	for {
		if len(items) > 0 {
			if !p.skipOp(",") {
				break
			}
			tuple = true
		}
		if p.atEnd() || p.isOp(")") || p.isOp("]") || p.isOp("}") || p.isOp("=") || p.isName("in") ||
			p.isName("recursive") || (!condexpr && p.isName("if")) {
			break
		}
		var n jNode
		var err error
		if condexpr {
			n, err = p.parseExpression()
		} else {
			n, err = p.parseOr()
		}
		if err != nil {
			return nil, err
		}
		items = append(items, n)
	}
	if !tuple {
		if len(items) == 0 {
			return nil, syntaxErr("expected an expression, got %s", p.describe())
		}
		return items[0], nil
	}
	return &jList{items: items, tuple: true}, nil
}

func (p *parser) parseExpression() (jNode, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	n, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var els jNode
		if p.skipName("else") {
			if els, err = p.parseExpression(); err != nil {
				return nil, err
			}
		}
		n = &jCond{then: n, cond: cond, els: els}
	}
	return n, nil
}

func (p *parser) parseOr() (jNode, error) {
	l, err := p.parseAnd()
	for err == nil && p.skipName("or") {
		var r jNode
		r, err = p.parseAnd()
		l = &jBin{op: "or", l: l, r: r}
	}
	return l, err
}

func (p *parser) parseAnd() (jNode, error) {
	l, err := p.parseNot()
	for err == nil && p.skipName("and") {
		var r jNode
		r, err = p.parseNot()
		l = &jBin{op: "and", l: l, r: r}
	}
	return l, err
}

func (p *parser) parseNot() (jNode, error) {
	if p.skipName("not") {
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.parseNot()
		return &jUnary{op: "not", x: x}, err
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (jNode, error) {
	first, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	c := &jCompare{first: first}
	for {
		var op string
		switch t := p.cur(); {
		case t.kind == tkOp && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">="):
			op = t.text
			p.next()
		case p.isName("in"):
			op = "in"
			p.next()
		case p.isName("not") && p.look().kind == tkName && p.look().text == "in":
			op = "not in"
			p.next()
			p.next()
		}
		if op == "" {
			break
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, op)
		c.rest = append(c.rest, r)
	}
	if len(c.ops) == 0 {
		return first, nil
	}
	return c, nil
}

func (p *parser) parseMath1() (jNode, error) {
	l, err := p.parseConcat()
	for err == nil && (p.isOp("+") || p.isOp("-")) {
		op := p.next().text
		var r jNode
		r, err = p.parseConcat()
		l = &jBin{op: op, l: l, r: r}
	}
	return l, err
}

func (p *parser) parseConcat() (jNode, error) {
	first, err := p.parseMath2()
	if err != nil || !p.isOp("~") {
		return first, err
	}
	c := &jConcat{items: []jNode{first}}
	for p.skipOp("~") {
		n, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		c.items = append(c.items, n)
	}
	return c, nil
}

func (p *parser) parseMath2() (jNode, error) {
	l, err := p.parsePow()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		op := p.next().text
		var r jNode
		r, err = p.parsePow()
		l = &jBin{op: op, l: l, r: r}
	}
	return l, err
}

func (p *parser) parsePow() (jNode, error) {
	l, err := p.parseUnary(true)
	for err == nil && p.isOp("**") {
		p.next()
		var r jNode
		r, err = p.parseUnary(true)
		l = &jBin{op: "**", l: l, r: r}
	}
	return l, err
}

func (p *parser) parseUnary(withFilter bool) (jNode, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	var n jNode
	var err error
	switch {
	case p.isOp("-") || p.isOp("+"):
		op := p.next().text
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		n = &jUnary{op: op, x: x}
	default:
		if n, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if n, err = p.parsePostfix(n); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(n)
	}
	return n, nil
}

func (p *parser) parsePrimary() (jNode, error) {
	t := p.cur()
	switch t.kind {
	case tkName:
		p.next()
		switch t.text {
		case "true", "True":
			return &jConst{v: true}, nil
		case "false", "False":
			return &jConst{v: false}, nil
		case "none", "None":
			return &jConst{v: nil}, nil
		}
		p.names[t.text] = true
		return &jName{name: t.text}, nil
	case tkString:
		var b strings.Builder
		for p.cur().kind == tkString {
			b.WriteString(p.next().str)
		}
		return &jConst{v: b.String()}, nil
	case tkInt:
		p.next()
		return &jConst{v: t.n}, nil
	case tkFloat:
		p.next()
		return &jConst{v: t.num}, nil
	case tkOp:
		switch t.text {
		case "(":
			p.next()
			if p.skipOp(")") {
				return &jList{tuple: true}, nil
			}
			n, err := p.parseTuple(true)
			if err != nil {
				return nil, err
			}
			return n, p.expectOp(")")
		case "[":
			p.next()
			l := &jList{}
			for !p.isOp("]") {
				if len(l.items) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("]") {
						break
					}
				}
				n, err := p.parseExpression()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, n)
			}
			return l, p.expectOp("]")
		case "{":
			p.next()
			d := &jDict{}
			for !p.isOp("}") {
				if len(d.keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("}") {
						break
					}
				}
				k, err := p.parseExpression()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpression()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
			}
			return d, p.expectOp("}")
		}
	}
	return nil, syntaxErr("unexpected %s", p.describe())
}

func (p *parser) parsePostfix(n jNode) (jNode, error) {
	for {
		var err error
		switch {
		case p.isOp("."):
			p.next()
			t := p.next()
			switch t.kind {
			case tkName:
				n = &jAttr{obj: n, name: t.text}
			case tkInt:
				n = &jItem{obj: n, key: &jConst{v: t.n}}
			default:
				return nil, syntaxErr("expected a name after '.'")
			}
		case p.isOp("["):
			p.next()
			var keys []jNode
			for !p.isOp("]") {
				if len(keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
				}
				k, err := p.parseSubscribed()
				if err != nil {
					return nil, err
				}
				keys = append(keys, k)
			}
			if err := p.expectOp("]"); err != nil {
				return nil, err
			}
			switch len(keys) {
			case 0:
				return nil, syntaxErr("expected a subscript")
			case 1:
				n = &jItem{obj: n, key: keys[0]}
			default:
				n = &jItem{obj: n, key: &jList{items: keys, tuple: true}}
			}
		case p.isOp("("):
			if n, err = p.parseCall(n); err != nil {
				return nil, err
			}
		default:
			return n, nil
		}
	}
}

func (p *parser) parseSubscribed() (jNode, error) {
	var start jNode
	if !p.isOp(":") {
		n, err := p.parseExpression()
		if err != nil || !p.isOp(":") {
			return n, err
		}
		start = n
	}
	p.next() // ':'
	s := &jSlice{start: start}
	var err error
	if !p.isOp(":") && !p.isOp("]") && !p.isOp(",") {
		if s.stop, err = p.parseExpression(); err != nil {
			return nil, err
		}
	}
	if p.skipOp(":") && !p.isOp("]") && !p.isOp(",") {
		if s.step, err = p.parseExpression(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (p *parser) parseCall(fn jNode) (jNode, error) {
	args, err := p.parseCallArgs()
	if err != nil {
		return nil, err
	}
	return &jCall{fn: fn, jArgs: args}, nil
}

// parseCallArgs reads (a, k=v, *args, **kwargs) as jinja2 does.
func (p *parser) parseCallArgs() (jArgs, error) {
	var a jArgs
	if err := p.expectOp("("); err != nil {
		return a, err
	}
	first := true
	for !p.isOp(")") {
		if !first {
			if err := p.expectOp(","); err != nil {
				return a, err
			}
			if p.isOp(")") {
				break
			}
		}
		first = false
		switch {
		case p.isOp("*"):
			p.next()
			if a.dyn != nil || a.dkw != nil {
				return a, syntaxErr("invalid syntax for function call expression")
			}
			n, err := p.parseExpression()
			if err != nil {
				return a, err
			}
			a.dyn = n
		case p.isOp("**"):
			p.next()
			if a.dkw != nil {
				return a, syntaxErr("invalid syntax for function call expression")
			}
			n, err := p.parseExpression()
			if err != nil {
				return a, err
			}
			a.dkw = n
		case p.cur().kind == tkName && p.look().kind == tkOp && p.look().text == "=":
			if a.dkw != nil {
				return a, syntaxErr("invalid syntax for function call expression")
			}
			name := p.next().text
			p.next()
			n, err := p.parseExpression()
			if err != nil {
				return a, err
			}
			a.kwNames, a.kwVals = append(a.kwNames, name), append(a.kwVals, n)
		default:
			if a.dyn != nil || a.dkw != nil || len(a.kwNames) > 0 {
				return a, syntaxErr("invalid syntax for function call expression")
			}
			n, err := p.parseExpression()
			if err != nil {
				return a, err
			}
			a.args = append(a.args, n)
		}
	}
	return a, p.expectOp(")")
}

// dottedName reads a filter's or a test's name (jinja2 allows dots in them).
func (p *parser) dottedName() (string, error) {
	t := p.next()
	if t.kind != tkName {
		return "", syntaxErr("expected a name, got '%s'", t.text)
	}
	name := t.text
	for p.isOp(".") && p.look().kind == tkName {
		p.next()
		name += "." + p.next().text
	}
	return name, nil
}

func (p *parser) parseFilterExpr(n jNode) (jNode, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			f, err := p.parseFilter(n)
			if err != nil {
				return nil, err
			}
			n = f
		case p.isName("is"):
			p.next()
			t, err := p.parseTest(n)
			if err != nil {
				return nil, err
			}
			n = t
		case p.isOp("("):
			c, err := p.parseCall(n)
			if err != nil {
				return nil, err
			}
			n = c
		default:
			return n, nil
		}
	}
}

func (p *parser) parseFilter(obj jNode) (*jFilter, error) {
	name, err := p.dottedName()
	if err != nil {
		return nil, err
	}
	f := &jFilter{obj: obj, name: name}
	if p.isOp("(") {
		if f.jArgs, err = p.parseCallArgs(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) parseTest(obj jNode) (jNode, error) {
	neg := p.skipName("not")
	name, err := p.dottedName()
	if err != nil {
		return nil, err
	}
	t := &jTest{obj: obj, name: name, neg: neg}
	c := p.cur()
	switch {
	case p.isOp("("):
		if t.jArgs, err = p.parseCallArgs(); err != nil {
			return nil, err
		}
	case c.kind == tkName && c.text != "else" && c.text != "or" && c.text != "and" ||
		c.kind == tkString || c.kind == tkInt || c.kind == tkFloat || p.isOp("[") || p.isOp("{"):
		if p.isName("is") {
			return nil, syntaxErr("you cannot chain multiple tests with is")
		}
		arg, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if arg, err = p.parsePostfix(arg); err != nil {
			return nil, err
		}
		t.args = []jNode{arg}
	}
	return t, nil
}
