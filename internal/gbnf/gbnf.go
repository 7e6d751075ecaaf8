// Package gbnf checks GBNF grammars and JSON schemas before they reach
// llama.cpp, in pure Go. llama.cpp's grammar code trusts its input: an empty
// character class or a grammar that later admits no token aborts the process
// in the sampler, a repetition whose maximum is below its minimum wraps an
// unsigned count and allocates until the kernel kills the process, and nested
// nullable alternatives make every decode step cost 2^N, and nested
// repetitions over shared characters make every token cost seconds (see
// live.go). Check parses the grammar the way llama.cpp does (same syntax,
// same rewriting of repetitions), under size limits, and rejects those shapes
// with an error naming the place or the cause.
// SchemaToGrammar converts a JSON schema to such a grammar, writing what
// llama.cpp's converter writes but with no cap on its output, and checks it.
package gbnf

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits bound a grammar. A zero field takes the default: 256 KiB, 65,536
// rules, 1,048,576 elements, depth 256, repetitions up to 2000 (llama.cpp's own
// cap), 1024 paths, 256 live stacks, 2^20 units of matching work.
type Limits struct {
	MaxBytes    int // source length
	MaxRules    int // rules after rewriting groups and repetitions
	MaxElements int // grammar elements after rewriting (llama.cpp allocates 8 bytes each)
	MaxDepth    int // nesting of parenthesised groups (llama.cpp recurses on the C stack)
	MaxRepeat   int // largest repetition bound in {m,n}; llama.cpp's own cap is 2000
	// MaxPaths bounds the parse stacks llama.cpp's matcher can build from one
	// position: the alternatives reachable through nullable prefixes,
	// multiplied out. Each stack is matched against every candidate token
	// every step, so this bounds the work of a step.
	MaxPaths int
	// MaxLiveStacks bounds the parse stacks that can be alive at once while
	// text is matched (see live.go): nested repetitions over shared
	// characters multiply them as the text grows.
	MaxLiveStacks int
	// MaxMatchWork bounds the live stacks times the parse paths one stack
	// may follow through a token's first characters (see live.go).
	MaxMatchWork int
}

// defaultLimits are generous for hand-written grammars and for the grammars
// llama.cpp converts JSON schemas to. A zero Limits field takes these.
func defaultLimits() Limits {
	return Limits{
		MaxBytes:    256 << 10,
		MaxRules:    64 << 10,
		MaxElements: 1 << 20,
		MaxDepth:    256,
		MaxRepeat:   2000,
		MaxPaths:    1024,
		// Measured with stories260K (512 tokens) on a loaded 2-core
		// machine: ([a-z]{0,10}){0,10} (91 live stacks, work 10^8) cost
		// 1.4 s a token, ("x" [a-z]{0,30}){0,30} (900 live) 1.7 s, and
		// ([a-z]+){0,50} (work 8*10^5) 0.15 s; the cost grows with the
		// vocabulary (and with the length of its tokens). llama.cpp's
		// JSON grammar is at 9 live stacks and work 6*10^4.
		MaxLiveStacks: 256,
		MaxMatchWork:  1 << 20,
	}
}

func (l Limits) withDefaults() Limits {
	d := defaultLimits()
	if l.MaxBytes > 0 {
		d.MaxBytes = l.MaxBytes
	}
	if l.MaxRules > 0 {
		d.MaxRules = l.MaxRules
	}
	if l.MaxElements > 0 {
		d.MaxElements = l.MaxElements
	}
	if l.MaxDepth > 0 {
		d.MaxDepth = l.MaxDepth
	}
	if l.MaxRepeat > 0 {
		d.MaxRepeat = l.MaxRepeat
	}
	if l.MaxPaths > 0 {
		d.MaxPaths = l.MaxPaths
	}
	if l.MaxLiveStacks > 0 {
		d.MaxLiveStacks = l.MaxLiveStacks
	}
	if l.MaxMatchWork > 0 {
		d.MaxMatchWork = l.MaxMatchWork
	}
	return d
}

// Error is a grammar rejected by Check. Line and Col (1-based) locate the
// problem in the source when it has a place, else they are 0.
type Error struct {
	Line, Col int
	Msg       string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d column %d: %s", e.Line, e.Col, e.Msg)
	}
	return e.Msg
}

// element types, as llama.cpp's llama_gretype.
type etype uint8

const (
	tEnd etype = iota
	tAlt
	tRef
	tChar
	tCharNot
	tRngUpper
	tCharAlt
	tCharAny
	tToken
	tTokenNot
)

type elem struct {
	t etype
	v uint32
}

type parser struct {
	src      string
	lim      Limits
	ids      map[string]int
	names    []string
	rules    [][]elem
	defined  []bool
	elements int
	depth    int
}

// bail carries an *Error out of the recursive descent.
type bail struct{ err *Error }

func (p *parser) fail(pos int, format string, args ...any) {
	line, col := 0, 0
	if pos >= 0 {
		line = 1 + strings.Count(p.src[:pos], "\n")
		col = pos - strings.LastIndexByte(p.src[:pos], '\n')
	}
	panic(bail{&Error{Line: line, Col: col, Msg: fmt.Sprintf(format, args...)}})
}

// Check parses a GBNF grammar (start symbol "root") and returns an *Error
// for anything llama.cpp would refuse or handle unsafely.
func Check(src string, lim Limits) (err error) {
	lim = lim.withDefaults()
	if len(src) > lim.MaxBytes {
		return &Error{Msg: fmt.Sprintf("is %d bytes; at most %d", len(src), lim.MaxBytes)}
	}
	if strings.IndexByte(src, 0) >= 0 {
		return &Error{Msg: "must not contain NUL bytes"}
	}
	if !utf8.ValidString(src) {
		return &Error{Msg: "must be valid UTF-8"}
	}
	p := &parser{src: src, lim: lim, ids: map[string]int{}}
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			err = b.err
		}
	}()
	pos := p.space(0, true)
	for pos < len(src) {
		pos = p.rule(pos)
	}
	root, ok := p.ids["root"]
	if !ok || !p.defined[root] {
		return &Error{Msg: "has no root rule"}
	}
	for i, name := range p.names {
		if !p.defined[i] {
			return &Error{Msg: fmt.Sprintf("rule %q is used but not defined", name)}
		}
	}
	if err := p.checkPaths(); err != nil {
		return err
	}
	return p.checkLive()
}

func (p *parser) at(i int) byte {
	if i < len(p.src) {
		return p.src[i]
	}
	return 0
}

func isWord(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || '0' <= c && c <= '9'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (p *parser) space(i int, newlineOK bool) int {
	for {
		c := p.at(i)
		switch {
		case c == '#':
			for i < len(p.src) && p.src[i] != '\r' && p.src[i] != '\n' {
				i++
			}
		case c == ' ' || c == '\t' || newlineOK && (c == '\r' || c == '\n'):
			i++
		default:
			return i
		}
	}
}

func (p *parser) name(i int) int {
	j := i
	for isWord(p.at(j)) {
		j++
	}
	if j == i {
		p.fail(i, "expected a rule name")
	}
	return j
}

func (p *parser) symbol(name string) int {
	if id, ok := p.ids[name]; ok {
		return id
	}
	return p.newSymbol(name)
}

func (p *parser) newSymbol(name string) int {
	if len(p.names) >= p.lim.MaxRules {
		p.fail(-1, "has more than %d rules (after expanding groups and repetitions)", p.lim.MaxRules)
	}
	id := len(p.names)
	p.ids[name] = id
	p.names = append(p.names, name)
	p.rules = append(p.rules, nil)
	p.defined = append(p.defined, false)
	return id
}

func (p *parser) grow(n int) {
	p.elements += n
	if p.elements > p.lim.MaxElements {
		p.fail(-1, "expands to more than %d elements (repetitions multiply their item)", p.lim.MaxElements)
	}
}

func (p *parser) setRule(id int, r []elem) {
	p.rules[id] = r
	p.defined[id] = true
}

func (p *parser) rule(i int) int {
	end := p.name(i)
	name := p.src[i:end]
	id := p.symbol(name)
	if p.defined[id] {
		p.fail(i, "rule %q is defined twice", name)
	}
	i = p.space(end, false)
	if !strings.HasPrefix(p.src[i:], "::=") {
		p.fail(i, "expected ::=")
	}
	i = p.space(i+3, true)
	i = p.alternates(i, name, id, false)
	switch p.at(i) {
	case '\r':
		i++
		if p.at(i) == '\n' {
			i++
		}
	case '\n':
		i++
	case 0:
	default:
		p.fail(i, "expected a newline or the end")
	}
	return p.space(i, true)
}

func (p *parser) alternates(i int, name string, id int, nested bool) int {
	var r []elem
	i = p.sequence(i, name, &r, nested)
	for p.at(i) == '|' {
		r = append(r, elem{t: tAlt})
		p.grow(1)
		i = p.space(i+1, true)
		i = p.sequence(i, name, &r, nested)
	}
	r = append(r, elem{t: tEnd})
	p.grow(1)
	p.setRule(id, r)
	return i
}

// char parses one character of a literal or class, with llama.cpp's escapes.
func (p *parser) char(i int) (uint32, int) {
	if p.at(i) == '\\' {
		hex := func(n int) (uint32, int) {
			if i+2+n > len(p.src) {
				p.fail(i, "expected %d hex digits", n)
			}
			v, err := strconv.ParseUint(p.src[i+2:i+2+n], 16, 32)
			if err != nil {
				p.fail(i, "expected %d hex digits", n)
			}
			// A surrogate is no character: the model would emit its
			// three UTF-8-shaped bytes, which are not valid UTF-8.
			if v >= 0xD800 && v <= 0xDFFF {
				p.fail(i, "escape %s is a lone UTF-16 surrogate, not a character", p.src[i:i+2+n])
			}
			if v > utf8.MaxRune {
				p.fail(i, "escape %s is beyond U+10FFFF", p.src[i:i+2+n])
			}
			return uint32(v), i + 2 + n
		}
		switch p.at(i + 1) {
		case 'x':
			return hex(2)
		case 'u':
			return hex(4)
		case 'U':
			return hex(8)
		case 't':
			return '\t', i + 2
		case 'r':
			return '\r', i + 2
		case 'n':
			return '\n', i + 2
		case '\\', '"', '[', ']':
			return uint32(p.src[i+1]), i + 2
		}
		p.fail(i, "unknown escape")
	}
	if i >= len(p.src) {
		p.fail(i, "unexpected end of input")
	}
	r, n := utf8.DecodeRuneInString(p.src[i:])
	return uint32(r), i + n
}

func (p *parser) sequence(i int, name string, r *[]elem, nested bool) int {
	last := len(*r) // start of the last symbol, for repetition
	push := func(es ...elem) {
		p.grow(len(es))
		*r = append(*r, es...)
	}
	for i < len(p.src) {
		c := p.src[i]
		switch {
		case c == '"':
			i++
			last = len(*r)
			for p.at(i) != '"' {
				if i >= len(p.src) {
					p.fail(i, "unterminated string")
				}
				var ch uint32
				ch, i = p.char(i)
				push(elem{tChar, ch})
			}
			i = p.space(i+1, nested)
		case c == '[':
			start := i
			i++
			t := tChar
			if p.at(i) == '^' {
				i++
				t = tCharNot
			}
			last = len(*r)
			var ranges [][2]uint32
			for p.at(i) != ']' {
				if i >= len(p.src) {
					p.fail(start, "unterminated character class")
				}
				var lo uint32
				lo, i = p.char(i)
				et := t
				if len(*r) > last {
					et = tCharAlt
				}
				push(elem{et, lo})
				hi := lo
				if p.at(i) == '-' && p.at(i+1) != ']' {
					if i+1 >= len(p.src) {
						p.fail(start, "unterminated character class")
					}
					hi, i = p.char(i + 1)
					if hi < lo {
						p.fail(start, "character class has a reversed range (%U-%U)", lo, hi)
					}
					push(elem{tRngUpper, hi})
				}
				ranges = append(ranges, [2]uint32{lo, hi})
			}
			if len(ranges) == 0 {
				p.fail(start, "character class is empty: it matches nothing")
			}
			if t == tCharNot && coversAll(ranges) {
				p.fail(start, "negated character class excludes every character: it matches nothing")
			}
			i = p.space(i+1, nested)
		case c == '<' || c == '!':
			t := tToken
			if c == '!' {
				t = tTokenNot
				i++
			}
			if p.at(i) != '<' {
				p.fail(i, "expected '<'")
			}
			// Only <[id]>: llama.cpp's checker has no vocabulary to parse
			// <text> tokens with, and it prints a grammar it cannot parse
			// raw to stderr.
			j := strings.IndexByte(p.src[i:], '>')
			if j < 4 || p.src[i+1] != '[' || p.src[i+j-1] != ']' || len(p.src[i+2:i+j-1]) > 9 || strings.Trim(p.src[i+2:i+j-1], "0123456789") != "" {
				p.fail(i, "tokens must be written <[ID]> with a numeric id")
			}
			last = len(*r)
			push(elem{t, 0})
			i = p.space(i+j+1, nested)
		case isWord(c):
			end := p.name(i)
			id := p.symbol(p.src[i:end])
			i = p.space(end, nested)
			last = len(*r)
			push(elem{tRef, uint32(id)})
		case c == '(':
			if p.depth++; p.depth > p.lim.MaxDepth {
				p.fail(i, "nests groups more than %d deep", p.lim.MaxDepth)
			}
			open := i
			i = p.space(i+1, true)
			sub := p.newSymbol(fmt.Sprintf("%s_%d", name, len(p.names)))
			i = p.alternates(i, name, sub, true)
			p.depth--
			last = len(*r)
			push(elem{tRef, uint32(sub)})
			if p.at(i) != ')' {
				p.fail(open, "group is not closed with ')'")
			}
			i = p.space(i+1, nested)
		case c == '.':
			last = len(*r)
			push(elem{tCharAny, 0})
			i = p.space(i+1, nested)
		case c == '*':
			i = p.space(i+1, nested)
			p.repeat(i, name, r, last, 0, -1)
		case c == '+':
			i = p.space(i+1, nested)
			p.repeat(i, name, r, last, 1, -1)
		case c == '?':
			i = p.space(i+1, nested)
			p.repeat(i, name, r, last, 0, 1)
		case c == '{':
			open := i
			i = p.space(i+1, nested)
			lo, hi := 0, -1
			lo, i = p.int(i)
			i = p.space(i, nested)
			switch p.at(i) {
			case '}':
				hi = lo
				i = p.space(i+1, nested)
			case ',':
				i = p.space(i+1, nested)
				if isDigit(p.at(i)) {
					hi, i = p.int(i)
					i = p.space(i, nested)
				}
				if p.at(i) != '}' {
					p.fail(i, "expected '}'")
				}
				i = p.space(i+1, nested)
			default:
				p.fail(i, "expected ',' or '}'")
			}
			if lo > p.lim.MaxRepeat || hi > p.lim.MaxRepeat {
				p.fail(open, "repetition bound is above %d", p.lim.MaxRepeat)
			}
			if hi >= 0 && hi < lo {
				p.fail(open, "repetition {%d,%d} has its maximum below its minimum", lo, hi)
			}
			p.repeat(open, name, r, last, lo, hi)
		default:
			return i
		}
	}
	return i
}

// int parses a repetition bound; anything beyond MaxRepeat is refused
// without converting (llama.cpp's std::stoul would wrap or throw).
func (p *parser) int(i int) (int, int) {
	j := i
	for isDigit(p.at(j)) {
		j++
	}
	if j == i {
		p.fail(i, "expected an integer")
	}
	digits := strings.TrimLeft(p.src[i:j], "0")
	if len(digits) > 6 {
		p.fail(i, "repetition bound is above %d", p.lim.MaxRepeat)
	}
	n, _ := strconv.Atoi(p.src[i:j])
	return n, j
}

// repeat rewrites the last symbol of r as llama.cpp does, with the element
// budget checked before each copy. hi < 0 means no maximum.
func (p *parser) repeat(pos int, name string, r *[]elem, last, lo, hi int) {
	if last == len(*r) {
		p.fail(pos, "repetition has no preceding item")
	}
	prev := append([]elem(nil), (*r)[last:]...)
	if lo == 0 {
		p.elements -= len(prev)
		*r = (*r)[:last]
	}
	for k := 1; k < lo; k++ {
		p.grow(len(prev))
		*r = append(*r, prev...)
	}
	nOpt := 1
	if hi >= 0 {
		nOpt = hi - lo
	}
	lastRec := 0
	for k := range nOpt {
		id := p.newSymbol(fmt.Sprintf("%s_%d", name, len(p.names)))
		rec := append([]elem(nil), prev...)
		if k > 0 || hi < 0 {
			ref := lastRec
			if hi < 0 {
				ref = id
			}
			rec = append(rec, elem{tRef, uint32(ref)})
		}
		rec = append(rec, elem{t: tAlt}, elem{t: tEnd})
		p.grow(len(rec))
		p.setRule(id, rec)
		lastRec = id
	}
	if nOpt > 0 {
		p.grow(1)
		*r = append(*r, elem{tRef, uint32(lastRec)})
	}
}

// coversAll reports whether the ranges cover every code point, so that a
// negated class of them matches nothing.
func coversAll(ranges [][2]uint32) bool {
	var next uint32 // every code point below next is covered
	for changed := true; changed; {
		changed = false
		for _, rg := range ranges {
			if rg[0] <= next && rg[1] >= next {
				next = rg[1] + 1
				changed = true
			}
		}
		if next > utf8.MaxRune {
			return true
		}
	}
	return false
}

// pathCount is a count that saturates instead of overflowing.
type pathCount uint64

const satCap = 1 << 40

func (a pathCount) add(b pathCount) pathCount { return min(a+b, satCap) }
func (a pathCount) mul(b pathCount) pathCount {
	if a != 0 && b > satCap/a {
		return satCap
	}
	return a * b
}

// checkPaths bounds how many parse stacks llama.cpp's matcher can build. For
// a position in a rule, f is the number of stacks that stop at a terminal
// when expanding from there to the end of its alternative, and g the number
// of ways to reach that end (through nullable rules), each of which then
// continues in the caller. A rule's F and G sum its alternatives'. A rule
// reached again through nullable prefixes while being expanded is left
// recursion, which llama.cpp refuses too.
func (p *parser) checkPaths() error {
	type fg struct{ f, g pathCount }
	memo := make([]fg, len(p.rules))
	state := make([]uint8, len(p.rules)) // 0 new, 1 in progress, 2 done
	var ruleFG func(id int) fg
	var seqFG func(r []elem, i int) fg
	seqFG = func(r []elem, i int) fg {
		// Walk forward: terminals end the expansion, refs multiply.
		acc := fg{0, 1} // ways to be here times ...
		for ; ; i++ {
			e := r[i]
			switch e.t {
			case tEnd, tAlt:
				return acc
			case tRef:
				sub := ruleFG(int(e.v))
				acc.f = acc.f.add(acc.g.mul(sub.f))
				acc.g = acc.g.mul(sub.g)
				if acc.g == 0 {
					return acc
				}
			case tRngUpper, tCharAlt:
				// part of the class before it
			default:
				acc.f = acc.f.add(acc.g)
				acc.g = 0
				return acc
			}
		}
	}
	ruleFG = func(id int) fg {
		switch state[id] {
		case 2:
			return memo[id]
		case 1:
			p.fail(-1, "rule %q is left-recursive", p.names[id])
		}
		state[id] = 1
		var sum fg
		r := p.rules[id]
		for i := 0; i < len(r); i++ {
			alt := seqFG(r, i)
			sum.f, sum.g = sum.f.add(alt.f), sum.g.add(alt.g)
			for r[i].t != tAlt && r[i].t != tEnd {
				i++
			}
		}
		memo[id], state[id] = sum, 2
		return sum
	}
	limit := pathCount(p.lim.MaxPaths)
	for id, r := range p.rules {
		// Every position a stack can rest at, computed backwards over
		// each alternative so the whole pass is linear.
		f, g := pathCount(0), pathCount(1)
		for i := len(r) - 1; i >= 0; i-- {
			switch e := r[i]; e.t {
			case tEnd, tAlt:
				f, g = 0, 1
			case tRef:
				sub := ruleFG(int(e.v))
				f, g = sub.f.add(sub.g.mul(f)), sub.g.mul(g)
			case tRngUpper, tCharAlt:
			default:
				f, g = 1, 0
			}
			if f > limit || g > limit {
				return &Error{Msg: fmt.Sprintf("rule %q has too many ways to continue (over %d): nested optional or empty alternatives multiply", p.names[id], p.lim.MaxPaths)}
			}
		}
	}
	return nil
}
