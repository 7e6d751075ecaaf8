package gbnf

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// pattern converts a string schema's regular expression to a rule matching
// the JSON strings whose value matches it. The subset: anchored with ^ and
// $, literals, escaped metacharacters, \d \w \s \D \W \S, \n \r \t \f \v,
// \xHH, \uHHHH, ".", classes [...] and [^...] with ranges, groups (...) and
// (?:...), alternation, and the quantifiers * + ? {n} {n,} {n,m} (a lazy ?
// after one is accepted: a whole-string match is the same either way).
// Anything else (lookarounds, backreferences, \b, \p, POSIX classes) is
// refused. Characters are written as JSON writes them: a quote as \", a
// backslash as \\, a tab as \t.
func (c *converter) pattern(v *jnode, path, hint string) string {
	if v.kind != 's' {
		c.fail(path, "must be a string")
	}
	if v.lone {
		c.fail(path, "has a lone UTF-16 surrogate escape")
	}
	if len(v.str) > maxPatternLen {
		c.fail(path, "is over %d bytes", maxPatternLen)
	}
	if len(v.str) < 2 || v.str[0] != '^' || v.str[len(v.str)-1] != '$' || strings.HasSuffix(v.str, `\$`) {
		c.fail(path, "must start with ^ and end with $")
	}
	p := &regex{c: c, src: v.str[1 : len(v.str)-1]}
	body, err := p.parse()
	if err != nil {
		c.fail(path, "%v", err)
	}
	c.primitive("space")
	return c.addRule(hint, `"\"" (`+body+`) "\"" space`)
}

type regex struct {
	c   *converter
	src string
	i   int
}

type regexErr struct{ msg string }

func (p *regex) fail(format string, args ...any) {
	panic(regexErr{fmt.Sprintf(format, args...)})
}

func (p *regex) parse() (s string, err error) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(regexErr)
			if !ok {
				panic(r)
			}
			s, err = "", fmt.Errorf("%s", e.msg)
		}
	}()
	s = p.alternation()
	if p.i < len(p.src) {
		p.fail("has an unbalanced ')'")
	}
	return s, nil
}

func (p *regex) alternation() string {
	alts := []string{p.sequence()}
	for p.i < len(p.src) && p.src[p.i] == '|' {
		p.i++
		alts = append(alts, p.sequence())
	}
	return strings.Join(alts, " | ")
}

// sequence parses items up to | or ) and joins them, merging runs of plain
// characters into one literal.
func (p *regex) sequence() string {
	var parts []string
	var lit strings.Builder // pending JSON text of plain characters
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, Literal(lit.String()))
			lit.Reset()
		}
	}
	for p.i < len(p.src) && p.src[p.i] != '|' && p.src[p.i] != ')' {
		item, isChar, r := p.atom()
		lo, hi, quantified := p.quantifier()
		if !quantified && isChar {
			lit.WriteString(jsonChar(r))
			continue
		}
		flush()
		if quantified {
			if isChar {
				item = Literal(jsonChar(r))
			}
			item = repeatItem(item, lo, hi)
		}
		if item != "" {
			parts = append(parts, item)
		}
	}
	flush()
	if len(parts) == 0 {
		return `""`
	}
	return strings.Join(parts, " ")
}

// repeatItem writes item{lo,hi} (hi < 0: no maximum).
func repeatItem(item string, lo, hi int) string {
	switch {
	case hi == 0:
		return ""
	case lo == 0 && hi == 1:
		return item + "?"
	case lo == 0 && hi < 0:
		return item + "*"
	case lo == 1 && hi < 0:
		return item + "+"
	case hi < 0:
		return fmt.Sprintf("%s{%d,}", item, lo)
	case lo == hi:
		return fmt.Sprintf("%s{%d}", item, lo)
	}
	return fmt.Sprintf("%s{%d,%d}", item, lo, hi)
}

// atom parses one item. A plain character comes back as isChar with its
// rune; anything else as a GBNF item (a group, a class or a rule name).
func (p *regex) atom() (item string, isChar bool, r rune) {
	switch ch := p.src[p.i]; ch {
	case '(':
		p.i++
		if strings.HasPrefix(p.src[p.i:], "?:") {
			p.i += 2
		} else if p.i < len(p.src) && p.src[p.i] == '?' {
			p.fail("uses (?...) other than (?:...), which is not supported")
		}
		inner := p.alternation()
		if p.i >= len(p.src) || p.src[p.i] != ')' {
			p.fail("has an unclosed '('")
		}
		p.i++
		return "(" + inner + ")", false, 0
	case '[':
		return p.class(), false, 0
	case '.':
		p.i++
		return p.c.primitive("pattern-dot"), false, 0
	case '\\':
		set, r := p.escape(false)
		if set != nil {
			return classItem(set, false), false, 0
		}
		return "", true, r
	case '*', '+', '?', '{':
		p.fail("has a quantifier %q with nothing before it", ch)
	case '^', '$':
		p.fail("may use ^ and $ only at its ends")
	}
	r, n := utf8.DecodeRuneInString(p.src[p.i:])
	p.i += n
	return "", true, r
}

func (p *regex) quantifier() (lo, hi int, ok bool) {
	if p.i >= len(p.src) {
		return 0, 0, false
	}
	switch p.src[p.i] {
	case '*':
		lo, hi = 0, -1
		p.i++
	case '+':
		lo, hi = 1, -1
		p.i++
	case '?':
		lo, hi = 0, 1
		p.i++
	case '{':
		j := strings.IndexByte(p.src[p.i:], '}')
		if j < 0 {
			p.fail("has an unclosed '{'")
		}
		body := p.src[p.i+1 : p.i+j]
		p.i += j + 1
		a, b, comma := strings.Cut(body, ",")
		var err error
		if lo, err = strconv.Atoi(a); err != nil {
			p.fail("has a malformed {n,m} quantifier")
		}
		hi = lo
		if comma {
			hi = -1
			if b != "" {
				if hi, err = strconv.Atoi(b); err != nil {
					p.fail("has a malformed {n,m} quantifier")
				}
			}
		}
	default:
		return 0, 0, false
	}
	if limit := defaultLimits().MaxRepeat; lo > limit || hi > limit {
		p.fail("repeats more than %d times", limit)
	}
	if hi >= 0 && hi < lo {
		p.fail("has a quantifier {%d,%d} whose maximum is below its minimum", lo, hi)
	}
	if p.i < len(p.src) && p.src[p.i] == '?' {
		p.i++ // lazy: the same strings match the whole pattern
	}
	if p.i < len(p.src) && strings.IndexByte("*+?{", p.src[p.i]) >= 0 {
		p.fail("has two quantifiers in a row")
	}
	return lo, hi, true
}

// span is an inclusive range of code points.
type span struct{ lo, hi rune }

var (
	digitSet = []span{{'0', '9'}}
	wordSet  = []span{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	spaceSet = []span{{'\t', '\r'}, {' ', ' '}}
)

// escape parses \x at p.i: a set for \d-style classes (negated reports \D
// and friends, allowed only outside a class), else one character.
func (p *regex) escape(inClass bool) (set []span, r rune) {
	if p.i+1 >= len(p.src) {
		p.fail("ends with a lone backslash")
	}
	e := p.src[p.i+1]
	p.i += 2
	switch e {
	case 'd', 'w', 's':
		return map[byte][]span{'d': digitSet, 'w': wordSet, 's': spaceSet}[e], 0
	case 'D', 'W', 'S':
		if inClass {
			p.fail(`uses \%c inside a class, which is not supported`, e)
		}
		return negate(map[byte][]span{'D': digitSet, 'W': wordSet, 'S': spaceSet}[e]), 0
	case 'n':
		return nil, '\n'
	case 'r':
		return nil, '\r'
	case 't':
		return nil, '\t'
	case 'f':
		return nil, '\f'
	case 'v':
		return nil, '\v'
	case 'x', 'u':
		n := 2
		if e == 'u' {
			n = 4
		}
		if p.i+n > len(p.src) {
			p.fail(`has a malformed \%c escape`, e)
		}
		v, err := strconv.ParseUint(p.src[p.i:p.i+n], 16, 32)
		if err != nil {
			p.fail(`has a malformed \%c escape`, e)
		}
		p.i += n
		r := rune(v)
		if utf16.IsSurrogate(r) {
			if r < 0xDC00 && strings.HasPrefix(p.src[p.i:], `\u`) && p.i+6 <= len(p.src) {
				if v2, err := strconv.ParseUint(p.src[p.i+2:p.i+6], 16, 32); err == nil && v2 >= 0xDC00 && v2 <= 0xDFFF {
					p.i += 6
					return nil, utf16.DecodeRune(r, rune(v2))
				}
			}
			p.fail(`has a lone UTF-16 surrogate \u%04X`, r)
		}
		return nil, r
	}
	if e >= 'a' && e <= 'z' || e >= 'A' && e <= 'Z' || e >= '0' && e <= '9' {
		p.fail(`uses \%c, which is not supported`, e)
	}
	r, n := utf8.DecodeRuneInString(p.src[p.i-1:])
	p.i += n - 1
	return nil, r
}

// class parses [...] at p.i.
func (p *regex) class() string {
	p.i++
	neg := false
	if p.i < len(p.src) && p.src[p.i] == '^' {
		neg = true
		p.i++
	}
	var set []span
	first := true
	for {
		if p.i >= len(p.src) {
			p.fail("has an unclosed '['")
		}
		if p.src[p.i] == ']' && !first {
			p.i++
			break
		}
		first = false
		lo, isSet := p.classChar(&set)
		if isSet {
			continue
		}
		if p.i+1 < len(p.src) && p.src[p.i] == '-' && p.src[p.i+1] != ']' {
			p.i++
			hi, hiSet := p.classChar(&set)
			if hiSet {
				p.fail("has a range ending in a class escape")
			}
			if hi < lo {
				p.fail("has a reversed range in a class")
			}
			set = append(set, span{lo, hi})
			continue
		}
		set = append(set, span{lo, lo})
	}
	return classItem(set, neg)
}

// classChar reads one character of a class, or appends a \d-style set.
func (p *regex) classChar(set *[]span) (rune, bool) {
	switch p.src[p.i] {
	case '\\':
		s, r := p.escape(true)
		if s != nil {
			*set = append(*set, s...)
			return 0, true
		}
		return r, false
	case '[':
		p.fail("has '[' inside a character class (POSIX classes such as [[:alpha:]] are not supported)")
	}
	r, n := utf8.DecodeRuneInString(p.src[p.i:])
	p.i += n
	return r, false
}

// negate returns the code points not in set.
func negate(set []span) []span {
	set = normalize(set)
	var out []span
	next := rune(0)
	for _, s := range set {
		if s.lo > next {
			out = append(out, span{next, s.lo - 1})
		}
		next = s.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, span{next, utf8.MaxRune})
	}
	return out
}

// normalize sorts and merges spans.
func normalize(set []span) []span {
	s := append([]span(nil), set...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].lo < s[j-1].lo; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	var out []span
	for _, x := range s {
		if n := len(out); n > 0 && x.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// jsonEscapes are the characters a JSON string must escape that a class can
// name, and how JSON writes them.
var jsonEscapes = []struct {
	r   rune
	esc string
}{{'"', `\"`}, {'\\', `\\`}, {'\b', `\b`}, {'\f', `\f`}, {'\n', `\n`}, {'\r', `\r`}, {'\t', `\t`}}

func contains(set []span, r rune) bool {
	for _, s := range set {
		if s.lo <= r && r <= s.hi {
			return true
		}
	}
	return false
}

// classItem writes a class as a GBNF item matching its characters as JSON
// writes them: raw where JSON allows the character raw, escaped otherwise
// (other control characters are left out).
func classItem(set []span, neg bool) string {
	if neg {
		set = negate(set)
	}
	raw := subtract(normalize(set), []span{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}})
	var alts []string
	if len(raw) > 0 {
		var b strings.Builder
		b.WriteByte('[')
		for _, s := range raw {
			writeClassChar(&b, s.lo)
			if s.hi != s.lo {
				b.WriteByte('-')
				writeClassChar(&b, s.hi)
			}
		}
		b.WriteByte(']')
		alts = append(alts, b.String())
	}
	for _, e := range jsonEscapes {
		if contains(set, e.r) {
			alts = append(alts, Literal(e.esc))
		}
	}
	switch len(alts) {
	case 0:
		panic(regexErr{"has a character class that matches nothing"})
	case 1:
		return alts[0]
	}
	return "(" + strings.Join(alts, " | ") + ")"
}

// subtract removes cuts from the sorted, merged set.
func subtract(set, cuts []span) []span {
	out := set
	for _, c := range cuts {
		var next []span
		for _, s := range out {
			if c.hi < s.lo || c.lo > s.hi {
				next = append(next, s)
				continue
			}
			if s.lo < c.lo {
				next = append(next, span{s.lo, c.lo - 1})
			}
			if s.hi > c.hi {
				next = append(next, span{c.hi + 1, s.hi})
			}
		}
		out = next
	}
	return out
}

// jsonChar returns r as JSON writes it inside a string.
func jsonChar(r rune) string {
	for _, e := range jsonEscapes {
		if e.r == r {
			return e.esc
		}
	}
	if r < 0x20 {
		return fmt.Sprintf(`\u%04x`, r)
	}
	return string(r)
}
