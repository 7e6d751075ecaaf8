package chat

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// The Jinja engine (github.com/ardanlabs/jinja, used as a module) differs from jinja2 on general behaviours that
// real chat templates rely on: its parser, its precedence, its whitespace control and Python's semantics. Parley
// therefore reads each template with jinja2's own lexing and grammar (this file, jinja_lex.go, jinja_parse.go) and
// hands the engine a prepared source that it renders as jinja2 does with Hugging Face's settings:
//   - line breaks become \n and one trailing line break is dropped (newline_sequence, keep_trailing_newline=False);
//   - whitespace control (- and +, trim_blocks, lstrip_blocks) is applied here, exactly as jinja2's lexer applies
//     it, and the text is written so that the engine's own trimming finds nothing to remove;
//   - comments are dropped and {% raw %} blocks become string literals;
//   - every expression is written back fully parenthesized, with helpers where the engine's semantics differ
//     (jinja_emit.go); every {{ expression }} prints through pyPrintName (Python's str());
//   - every macro gets a last parameter whose default calls pyEnterName, so that each macro call checks how deep
//     the render's stack is and refuses a recursion without end (jinja2's RecursionError) before it overflows;
//     every macro is wrapped by pyMacroName, which binds its arguments as jinja2 does (varargs, kwargs);
//   - a template jinja2 refuses to compile (a syntax error, an unknown tag) is refused, an unknown filter or test
//     fails the render that reaches it (as jinja2 does inside an if block), and a source nested deeper than
//     maxSourceNesting is refused before any recursive parser sees it.
// What the engine cannot hold fails the render with a clear error instead of rendering other text: an int past 64
// bits, a recursive for loop, a set of several names, a filter block with arguments.

// maxSourceNesting bounds how deeply a template's source nests brackets inside a tag, and blocks: the parsers are
// recursive. jinja2's own parser raises RecursionError near 50 nested parentheses; real templates nest a few.
const maxSourceNesting = 256

// errRecursion is the error of a template that nests or recurses without bound, as jinja2's RecursionError.
var errRecursion = errors.New("maximum recursion depth exceeded")

var (
	rawOpen  = regexp.MustCompile(`^\{%[-+]?\s*raw\s*(-%\}\s*|%\})`)
	rawClose = regexp.MustCompile(`\{%([-+]?)\s*endraw\s*(\+%\}|-%\}\s*|%\}\n?)`)
)

// preparer holds the state of one prepareSource.
type preparer struct {
	out    strings.Builder
	blocks []string      // the open blocks' keywords
	macros []*macroFrame // the open macros, innermost last
	hoist  int           // macro defaults hoisted so far
	loops  []loopFrame   // the open for loops, innermost last
}

// loopFrame is an open for loop: its names are bound to items of a list (never an undefined value) until a set
// rebinds one, so reading their attributes needs no check for an undefined value.
type loopFrame struct {
	names   []string
	macros  int             // how many macros were open at the loop (a macro's body sees its own names)
	rebound map[string]bool // names a set rebinds inside the loop
}

// loopVar reports whether name is an open loop's name that no set has rebound.
func (p *preparer) loopVar(name string) bool {
	for i := len(p.loops) - 1; i >= 0; i-- {
		f := p.loops[i]
		if f.macros != len(p.macros) || f.rebound[name] {
			return false
		}
		if name == "loop" || slices.Contains(f.names, name) {
			return true
		}
	}
	return false
}

// emitter returns an emitter that knows the open loops' names.
func (p *preparer) emitter() emitter { return emitter{defined: p.loopVar} }

type macroFrame struct {
	name   string
	params []string
	names  map[string]bool // the names its body reads
}

// prepareSource returns src prepared for the engine (see above), or an error for a template jinja2 refuses or
// one nested too deeply.
func prepareSource(src string) (string, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	p := &preparer{}
	p.out.Grow(len(src) + len(src)/4)
	lineStarting := true // jinja2's line_starting: the last thing read ended a line
	pos := 0
	for pos < len(src) {
		open := nextTag(src, pos)
		if open < 0 {
			p.text(src[pos:])
			break
		}
		text := src[pos:open]
		kind := src[open+1]
		from := open + 2
		var sign byte
		if from < len(src) && (src[from] == '-' || src[from] == '+') {
			sign = src[from]
			from++
		}
		switch {
		case sign == '-':
			text = strings.TrimRightFunc(text, isPySpace)
		case sign != '+' && kind != '{':
			text = lstripBlock(text, lineStarting)
		}
		p.text(text)
		if m := rawOpen.FindStringSubmatch(src[open:]); kind == '%' && m != nil {
			end, err := p.raw(src, open+len(m[0]), strings.HasSuffix(m[0], "\n"))
			if err != nil {
				return "", err
			}
			pos, lineStarting = end, src[end-1] == '\n'
			continue
		}
		var end int
		switch kind {
		case '#':
			c := strings.Index(src[from:], "#}")
			if c < 0 {
				return "", syntaxErr("missing end of comment tag")
			}
			c += from
			end = closeTag(src, c, src[c-1], true)
		default:
			closer := "}}"
			if kind == '%' {
				closer = "%}"
			}
			toks, c, csign, err := lexTag(src, from, closer)
			if err != nil {
				return "", err
			}
			if kind == '{' {
				err = p.output(toks)
			} else {
				err = p.statement(toks)
			}
			if err != nil {
				return "", err
			}
			if csign != 0 {
				c++
			}
			end = closeTag(src, c, csign, kind == '%')
		}
		pos, lineStarting = end, src[end-1] == '\n'
	}
	if len(p.blocks) > 0 {
		return "", syntaxErr("unexpected end of template: the %s block is not closed", p.blocks[len(p.blocks)-1])
	}
	return p.out.String(), nil
}

// nextTag returns the index of the next {{, {% or {# at or after from; -1 when there is none.
func nextTag(src string, from int) int {
	for i := from; ; i++ {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			return -1
		}
		i += j
		if c := src[i+1]; c == '{' || c == '%' || c == '#' {
			return i
		}
	}
}

// closeTag returns the index past a tag's closer at src[c:c+2] and what jinja2 consumes after it: with the - sign
// every whitespace character, with no sign after a block or a comment one newline (trim_blocks).
func closeTag(src string, c int, sign byte, block bool) int {
	end := c + 2
	switch {
	case sign == '-':
		for end < len(src) {
			r, size := utf8.DecodeRuneInString(src[end:])
			if !isPySpace(r) {
				break
			}
			end += size
		}
	case sign != '+' && block && end < len(src) && src[end] == '\n':
		end++
	}
	return end
}

// lstripBlock is lstrip_blocks: the spaces between the start of the line and a block or comment tag are removed.
func lstripBlock(text string, lineStarting bool) string {
	l := strings.LastIndexByte(text, '\n') + 1
	if l == 0 && !lineStarting {
		return text
	}
	if rest := text[l:]; rest != "" && strings.TrimLeftFunc(rest, isPySpace) == "" {
		return text[:l]
	}
	return text
}

// raw writes a {% raw %} block's text, whose body starts at from, as a string literal, and returns the index past
// its endraw tag.
func (p *preparer) raw(src string, from int, lineStarting bool) (int, error) {
	loc := rawClose.FindStringSubmatchIndex(src[from:])
	if loc == nil {
		return 0, syntaxErr("missing end of raw directive")
	}
	body := src[from : from+loc[0]]
	switch src[from+loc[2] : from+loc[3]] {
	case "-":
		body = strings.TrimRightFunc(body, isPySpace)
	case "":
		body = lstripBlock(body, lineStarting)
	}
	if body != "" {
		p.out.WriteString("{{ " + quoteEngine(body) + " }}")
	}
	return from + loc[1], nil
}

// text writes template text so that the engine keeps it as it stands: the engine's trim_blocks removes a newline
// at the start of the text after a block and its lstrip_blocks the spaces at the end of the text before one (even
// across other tags), so a leading run of newlines and a trailing run of spaces are written as string literals.
func (p *preparer) text(t string) {
	if t == "" {
		return
	}
	lead := len(t) - len(strings.TrimLeft(t, "\n"))
	mid := t[lead:]
	body := strings.TrimRight(mid, " \t")
	tail := mid[len(body):]
	if lead > 0 {
		p.out.WriteString("{{ " + quoteEngine(t[:lead]) + " }}")
	}
	if strings.HasSuffix(body, "{") { // a { just before the next tag would open a tag of its own
		tail = "{" + tail
		body = body[:len(body)-1]
	}
	p.out.WriteString(body)
	if tail != "" {
		p.out.WriteString("{{ " + quoteEngine(tail) + " }}")
	}
}

// output writes a {{ expression }} tag.
func (p *preparer) output(toks []token) error {
	ps := newParser(toks)
	n, err := ps.parseTuple(true)
	if err != nil {
		return err
	}
	if !ps.atEnd() {
		return syntaxErr("unexpected %s", ps.describe())
	}
	p.noteNames(ps)
	e := p.emitter()
	s := e.expr(n)
	if e.err != nil {
		return e.err
	}
	p.out.WriteString("{{ " + pyPrintName + "(" + s + ") }}")
	return nil
}

// noteNames records the names a tag reads in the innermost open macro (a macro reading varargs or kwargs takes
// extra arguments).
func (p *preparer) noteNames(ps *parser) {
	if len(p.macros) == 0 {
		return
	}
	m := p.macros[len(p.macros)-1]
	for n := range ps.names {
		m.names[n] = true
	}
}

// blockKeywords open a block that an end tag closes.
var blockKeywords = map[string]string{
	"if": "endif", "for": "endfor", "macro": "endmacro", "call": "endcall", "filter": "endfilter",
	"set": "endset", "generation": "endgeneration",
}

func (p *preparer) open(kw string) error {
	p.blocks = append(p.blocks, kw)
	if len(p.blocks) > maxSourceNesting {
		return fmt.Errorf("%w: blocks nest more than %d levels", errRecursion, maxSourceNesting)
	}
	return nil
}

func (p *preparer) close(end string) error {
	if len(p.blocks) == 0 || blockKeywords[p.blocks[len(p.blocks)-1]] != end {
		return syntaxErr("encountered unknown tag '%s'", end)
	}
	p.blocks = p.blocks[:len(p.blocks)-1]
	return nil
}

// statement writes a {% %} tag.
func (p *preparer) statement(toks []token) error {
	if len(toks) == 0 || toks[0].kind != tkName {
		return syntaxErr("tag name expected")
	}
	kw := toks[0].text
	ps := newParser(toks[1:])
	e := p.emitter()
	var s string
	switch kw {
	case "if", "elif":
		if kw == "if" {
			if err := p.open(kw); err != nil {
				return err
			}
		} else if len(p.blocks) == 0 || p.blocks[len(p.blocks)-1] != "if" {
			return syntaxErr("encountered unknown tag 'elif'")
		}
		n, err := ps.parseTuple(false)
		if err != nil {
			return err
		}
		s = kw + " " + e.expr(n)
	case "else":
		if len(p.blocks) == 0 || (p.blocks[len(p.blocks)-1] != "if" && p.blocks[len(p.blocks)-1] != "for") {
			return syntaxErr("encountered unknown tag 'else'")
		}
		s = kw
	case "for":
		if err := p.open(kw); err != nil {
			return err
		}
		var err error
		if s, err = p.forTag(ps, &e); err != nil {
			return err
		}
	case "set":
		var err error
		if s, err = p.setTag(ps, &e); err != nil {
			return err
		}
	case "macro":
		if err := p.open(kw); err != nil {
			return err
		}
		var err error
		if s, err = p.macroTag(ps, &e); err != nil {
			return err
		}
	case "call":
		if err := p.open(kw); err != nil {
			return err
		}
		var err error
		if s, err = p.callTag(ps, &e); err != nil {
			return err
		}
	case "filter":
		if err := p.open(kw); err != nil {
			return err
		}
		name, err := ps.dottedName()
		if err != nil {
			return err
		}
		if !ps.atEnd() || !jinja2Filters[name] {
			return syntaxErr("unsupported filter block %q", name)
		}
		s = kw + " " + name
	case "generation":
		if err := p.open(kw); err != nil {
			return err
		}
		s = kw
	case "break", "continue":
		if !slices.Contains(p.blocks, "for") {
			return syntaxErr("encountered unknown tag '%s'", kw)
		}
		s = kw
	case "endif", "endfor", "endcall", "endfilter", "endset", "endgeneration":
		if err := p.close(kw); err != nil {
			return err
		}
		if kw == "endfor" {
			p.loops = p.loops[:len(p.loops)-1]
		}
		s = kw
	case "endmacro":
		if err := p.close(kw); err != nil {
			return err
		}
		s = p.endMacro()
	default:
		return syntaxErr("encountered unknown tag '%s'", kw)
	}
	if e.err != nil {
		return e.err
	}
	if !ps.atEnd() {
		return syntaxErr("expected the end of the statement block, got %s", ps.describe())
	}
	p.noteNames(ps)
	p.out.WriteString("{% " + s + " %}")
	return nil
}

// endMacro writes the end of the innermost macro and the wrapper that binds its arguments as jinja2 does (extra
// positional arguments to varargs, extra keywords to kwargs, a TypeError where the macro reads neither).
func (p *preparer) endMacro() string {
	m := p.macros[len(p.macros)-1]
	p.macros = p.macros[:len(p.macros)-1]
	quoted := make([]string, len(m.params))
	for i, n := range m.params {
		quoted[i] = quoteEngine(n)
	}
	s := "endmacro %}{% set " + m.name + " = " + pyMacroName + "(" + m.name + ", " + quoteEngine(m.name) + ", [" +
		strings.Join(quoted, ", ") + "], " + fmt.Sprint(m.names["varargs"]) + ", " + fmt.Sprint(m.names["kwargs"]) + ")"
	if len(p.macros) > 0 { // an inner macro's names are read by the outer body too
		for n := range m.names {
			p.macros[len(p.macros)-1].names[n] = true
		}
	}
	return s
}

// assignTarget reads a for loop's or a set's target: names, possibly in parentheses.
func assignTarget(ps *parser) ([]string, error) {
	paren := ps.skipOp("(")
	var names []string
	for {
		t := ps.next()
		if t.kind != tkName {
			return nil, syntaxErr("can't assign to %q", t.text)
		}
		names = append(names, t.text)
		if !ps.skipOp(",") || ps.isOp(")") || ps.isName("in") || ps.isOp("=") {
			break
		}
	}
	if paren {
		if err := ps.expectOp(")"); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (p *preparer) forTag(ps *parser, e *emitter) (string, error) {
	names, err := assignTarget(ps)
	if err != nil {
		return "", err
	}
	if len(names) > 2 {
		return "", syntaxErr("a for loop over more than two names is not supported")
	}
	if !ps.skipName("in") {
		return "", syntaxErr("expected 'in', got %s", ps.describe())
	}
	iter, err := ps.parseTuple(false)
	if err != nil {
		return "", err
	}
	s := "for " + strings.Join(names, ", ") + " in " + pyIterName + "(" + e.expr(iter) + ")"
	if ps.skipName("if") {
		cond, err := ps.parseExpression()
		if err != nil {
			return "", err
		}
		if len(names) == 2 {
			// The engine evaluates a loop's filter with the second name bound to the whole item (a pair) and
			// the first not bound: the filter reads the pair's halves instead.
			e.rename = map[string]string{names[0]: names[1] + "[0]", names[1]: names[1] + "[1]"}
		}
		s += " if (" + e.expr(cond) + ")"
		e.rename = nil
	}
	if ps.isName("recursive") {
		return "", syntaxErr("recursive for loops are not supported")
	}
	p.loops = append(p.loops, loopFrame{names: names, macros: len(p.macros), rebound: map[string]bool{}})
	return s, nil
}

func (p *preparer) setTag(ps *parser, e *emitter) (string, error) {
	t := ps.next()
	if t.kind != tkName {
		return "", syntaxErr("can't assign to %q", t.text)
	}
	target := t.text
	for _, f := range p.loops {
		f.rebound[target] = true
	}
	if ps.skipOp(".") {
		attr := ps.next()
		if attr.kind != tkName {
			return "", syntaxErr("expected a name after '.'")
		}
		target += "." + attr.text
	}
	if ps.isOp(",") {
		return "", syntaxErr("assigning to several names is not supported")
	}
	if !ps.skipOp("=") {
		if !ps.atEnd() || strings.Contains(target, ".") {
			return "", syntaxErr("a set block with a filter is not supported")
		}
		return "set " + target, p.open("set")
	}
	v, err := ps.parseTuple(true)
	if err != nil {
		return "", err
	}
	return "set " + target + " = " + e.expr(v), nil
}

func (p *preparer) macroTag(ps *parser, e *emitter) (string, error) {
	t := ps.next()
	if t.kind != tkName {
		return "", syntaxErr("expected a macro name")
	}
	m := &macroFrame{name: t.text, names: map[string]bool{}}
	if err := ps.expectOp("("); err != nil {
		return "", err
	}
	var params, hoisted []string
	for !ps.isOp(")") {
		if len(m.params) > 0 {
			if err := ps.expectOp(","); err != nil {
				return "", err
			}
		}
		name := ps.next()
		if name.kind != tkName {
			return "", syntaxErr("expected a parameter name")
		}
		m.params = append(m.params, name.text)
		param := name.text
		if ps.skipOp("=") {
			def, err := ps.parseExpression()
			if err != nil {
				return "", err
			}
			d := e.expr(def)
			if strings.ContainsAny(d, ",=") { // the engine splits parameters at commas and a default at =
				p.hoist++
				v := fmt.Sprintf("parley_default_%d", p.hoist)
				hoisted = append(hoisted, "{% set "+v+" = "+d+" %}")
				d = v
			}
			param += "=" + d
		}
		params = append(params, param)
	}
	if err := ps.expectOp(")"); err != nil {
		return "", err
	}
	p.macros = append(p.macros, m)
	// The engine binds parameters in order: varargs and kwargs, which pyMacro passes by name, come after the
	// template's own.
	params = append(params, "varargs=none", "kwargs=none", pyEnterName+"_depth="+pyEnterName+"()")
	for _, h := range hoisted {
		p.out.WriteString(h)
	}
	return "macro " + m.name + "(" + strings.Join(params, ", ") + ")", nil
}

func (p *preparer) callTag(ps *parser, e *emitter) (string, error) {
	var params []string
	if ps.skipOp("(") {
		for !ps.isOp(")") {
			if len(params) > 0 {
				if err := ps.expectOp(","); err != nil {
					return "", err
				}
			}
			t := ps.next()
			if t.kind != tkName || ps.isOp("=") {
				return "", syntaxErr("unsupported call block parameter")
			}
			params = append(params, t.text)
		}
		ps.next()
	}
	n, err := ps.parseExpression()
	if err != nil {
		return "", err
	}
	if _, ok := n.(*jCall); !ok {
		return "", syntaxErr("expected a call in the call block")
	}
	s := "call"
	if params != nil {
		s += "(" + strings.Join(params, ", ") + ")"
	}
	return s + " " + e.expr(n), nil
}
