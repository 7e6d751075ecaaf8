package chat

import (
	"fmt"
	"strconv"
	"strings"
)

// The parser of a Jinja tag's tokens: jinja2's grammar and precedence (parse_expression and below in jinja2's
// parser.py), building the tree that jinja_emit.go writes back for the engine.

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
