package chat

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// The Jinja engine (github.com/ardanlabs/jinja, used as a module) differs from jinja2 on a few general behaviours
// that real chat templates rely on. Parley prepares each template's source before the engine parses it, so that the
// engine renders it as jinja2 does with Hugging Face's settings:
//   - line breaks become \n and one trailing line break is dropped (jinja2's newline_sequence and
//     keep_trailing_newline=False);
//   - every {{ expression }} prints through pyPrintName, which prints None as None (the engine prints "");
//   - |string goes through pyStringName (None as None), every tojson(...) with arguments through pyTojsonName
//     (Python's json.dumps: indent, separators, sort_keys, ensure_ascii);
//   - a test with one argument and no parentheses (x is sameas true) gets its parentheses;
//   - every macro gets a last parameter whose default calls pyEnterName, so that each macro call checks how deep
//     the render's stack is and refuses a recursion without end (jinja2's RecursionError) before it overflows;
//   - a source nested deeper than maxSourceNesting is refused before the engine's recursive parser sees it.
// Each rewrite is made inside tags only, outside string literals, and {% raw %} blocks and comments are left alone.

// Names of the helpers the prepared source calls; names no real template uses. They are variables of the render
// (the engine looks a filter up among the variables when it has no builtin of that name).
const (
	pyTojsonName = "parley_tojson"
	pyPrintName  = "parley_print"
	pyStringName = "parley_string"
	pyEnterName  = "parley_enter"
)

// maxSourceNesting bounds how deeply a template's source nests brackets inside a tag, and blocks: the engine parses
// both recursively. jinja2's own parser raises RecursionError near 50 nested parentheses; real templates nest a few.
const maxSourceNesting = 256

// errRecursion is the error of a template that nests or recurses without bound, as jinja2's RecursionError.
var errRecursion = errors.New("maximum recursion depth exceeded")

var (
	tojsonCall   = regexp.MustCompile(`\btojson\s*\(`)
	stringFilter = regexp.MustCompile(`\|\s*string\b`)
	// A test name, then one argument without parentheses: a number, a string, true/false/none, or a name with
	// attributes. Python's keywords that may follow a test are not arguments.
	bareTestArg = regexp.MustCompile(`\bis(\s+not)?\s+([A-Za-z_]\w*)\s+(-?\d+(?:\.\d+)?|'[^']*'|"[^"]*"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)`)
	macroTag    = regexp.MustCompile(`^(\s*macro\s+[A-Za-z_]\w*\s*\()(.*)\)(\s*)$`)
	blockOpen   = regexp.MustCompile(`^\s*(if|for|macro|call|filter|raw)\b`)
	blockSet    = regexp.MustCompile(`^\s*set\s+[\w.]+\s*$`) // {% set x %}...{% endset %}
	blockClose  = regexp.MustCompile(`^\s*end(if|for|macro|call|filter|set)\b`)
)

// testKeywords follow a test without being its argument.
var testKeywords = map[string]bool{"and": true, "or": true, "else": true, "if": true, "in": true, "is": true, "not": true}

// prepareSource returns src prepared for the engine (see above), or an error for a source nested too deeply.
func prepareSource(src string) (string, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var b strings.Builder
	b.Grow(len(src) + len(src)/8)
	blocks := 0
	for i := 0; i < len(src); {
		open := strings.Index(src[i:], "{")
		if open < 0 || i+open+1 >= len(src) {
			b.WriteString(src[i:])
			break
		}
		open += i
		kind := src[open+1]
		if kind != '{' && kind != '%' && kind != '#' {
			b.WriteString(src[i : open+1])
			i = open + 1
			continue
		}
		b.WriteString(src[i:open])
		if kind == '#' {
			end := strings.Index(src[open+2:], "#}")
			if end < 0 {
				b.WriteString(src[open:])
				break
			}
			b.WriteString(src[open : open+2+end+2])
			i = open + 2 + end + 2
			continue
		}
		closer := "}}"
		if kind == '%' {
			closer = "%}"
		}
		end := tagEnd(src, open+2, closer)
		if end < 0 { // unterminated: the engine reports it
			b.WriteString(src[open:])
			break
		}
		inner := src[open+2 : end]
		lead, body, trail := splitMarkers(inner)
		if depth := bracketDepth(body); depth > maxSourceNesting {
			return "", fmt.Errorf("%w: a tag nests %d brackets, more than %d", errRecursion, depth, maxSourceNesting)
		}
		if kind == '%' {
			switch {
			case blockOpen.MatchString(body) || blockSet.MatchString(body):
				blocks++
				if blocks > maxSourceNesting {
					return "", fmt.Errorf("%w: blocks nest more than %d levels", errRecursion, maxSourceNesting)
				}
			case blockClose.MatchString(body):
				blocks--
			}
			if strings.HasPrefix(strings.TrimSpace(body), "raw") {
				// Everything up to endraw is text.
				rest := strings.Index(src[end:], "endraw")
				if rest < 0 {
					b.WriteString(src[open:])
					break
				}
				stop := strings.Index(src[end+rest:], "%}")
				if stop < 0 {
					b.WriteString(src[open:])
					break
				}
				blocks--
				b.WriteString(src[open : end+rest+stop+2])
				i = end + rest + stop + 2
				continue
			}
			body = rewriteStatement(body)
		} else {
			body = pyPrintName + "(" + rewriteExpression(body) + ")"
		}
		b.WriteString(src[open : open+2])
		b.WriteString(lead)
		b.WriteString(body)
		b.WriteString(trail)
		b.WriteString(closer)
		i = end + 2
	}
	return b.String(), nil
}

// tagEnd returns the index of closer that ends the tag whose body starts at from, skipping string literals; -1 when
// there is none.
func tagEnd(src string, from int, closer string) int {
	var quote byte
	for j := from; j < len(src); j++ {
		c := src[j]
		switch {
		case quote != 0:
			if c == '\\' {
				j++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case strings.HasPrefix(src[j:], closer):
			return j
		}
	}
	return -1
}

// splitMarkers splits a tag's inside into its whitespace-control markers (- or +) and its body.
func splitMarkers(inner string) (lead, body, trail string) {
	if strings.HasPrefix(inner, "-") || strings.HasPrefix(inner, "+") {
		lead, inner = inner[:1], inner[1:]
	}
	if strings.HasSuffix(inner, "-") || strings.HasSuffix(inner, "+") {
		trail, inner = inner[len(inner)-1:], inner[:len(inner)-1]
	}
	return lead, inner, trail
}

// bracketDepth is the deepest nesting of (, [ and { in an expression, outside string literals.
func bracketDepth(s string) int {
	depth, deepest := 0, 0
	var quote byte
	for j := 0; j < len(s); j++ {
		c := s[j]
		switch {
		case quote != 0:
			if c == '\\' {
				j++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(' || c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ')' || c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// rewriteStatement rewrites a {% %} tag's body: a macro gets its depth-check parameter, expressions their helpers.
func rewriteStatement(body string) string {
	if m := macroTag.FindStringSubmatch(body); m != nil {
		params := strings.TrimSpace(m[2])
		sep := ", "
		if params == "" {
			sep = ""
		}
		return m[1] + rewriteExpression(m[2]) + sep + pyEnterName + "_depth=" + pyEnterName + "()" + ")" + m[3]
	}
	return rewriteExpression(body)
}

// rewriteExpression applies the expression rewrites outside string literals.
func rewriteExpression(s string) string {
	return outsideStrings(s, func(code string) string {
		code = tojsonCall.ReplaceAllString(code, pyTojsonName+"(")
		code = stringFilter.ReplaceAllString(code, "|"+pyStringName)
		return bareTestArg.ReplaceAllStringFunc(code, func(t string) string {
			m := bareTestArg.FindStringSubmatch(t)
			if testKeywords[m[3]] || testKeywords[m[2]] {
				return t
			}
			return "is" + m[1] + " " + m[2] + "(" + m[3] + ")"
		})
	})
}

// outsideStrings applies f to the parts of s outside string literals. A test argument that is itself a string
// literal is rewritten with the code before it, so string literals are kept whole inside each part.
func outsideStrings(s string, f func(string) string) string {
	var b strings.Builder
	var quote byte
	start := 0
	for j := 0; j < len(s); j++ {
		c := s[j]
		switch {
		case quote != 0:
			if c == '\\' {
				j++
			} else if c == quote {
				quote = 0
				b.WriteString(s[start : j+1])
				start = j + 1
			}
		case c == '\'' || c == '"':
			b.WriteString(f(s[start:j]))
			start = j
			quote = c
		}
	}
	if quote != 0 {
		b.WriteString(s[start:])
	} else {
		b.WriteString(f(s[start:]))
	}
	return b.String()
}
