package chat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer of the inside of a Jinja tag, as jinja2's: names, string literals with Python's escapes, numbers,
// operators, and the tag's end found outside brackets. prepareSource parses each tag's tokens (jinja_parse.go) and
// writes them back for the engine (jinja_emit.go).

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
				stack = append(stack, closing(op[0]))
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

// closing is the bracket that closes open.
func closing(open byte) byte {
	switch open {
	case '(':
		return ')'
	case '[':
		return ']'
	}
	return '}'
}
