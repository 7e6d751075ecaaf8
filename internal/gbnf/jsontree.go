package gbnf

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/parley-chat/parley/internal/pyjson"
)

// jnode is one JSON value of a schema, read in document order: the
// converter emits properties in the order the client wrote them, which a Go
// map would lose.
type jnode struct {
	kind byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' boolean, 'z' null
	str  string
	// lone: the string (or, for a key, the key) had a \uD800-\uDFFF escape
	// without its pair. Go would read it as U+FFFD; a grammar must not
	// carry it either way, so it is refused where a string reaches one.
	lone  bool
	b     bool
	keys  []string
	lones []bool // per key, like lone
	vals  []*jnode
}

func (n *jnode) get(key string) *jnode {
	if n == nil || n.kind != 'o' {
		return nil
	}
	for i, k := range n.keys {
		if k == key {
			return n.vals[i]
		}
	}
	return nil
}

func (n *jnode) has(key string) bool { return n.get(key) != nil }

// jsonReader parses JSON into jnodes under a node count and a depth limit.
type jsonReader struct {
	src      string
	i        int
	nodes    int
	maxNodes int
	maxDepth int
}

type jsonError struct{ msg string }

func (r *jsonReader) fail(format string, args ...any) {
	panic(jsonError{fmt.Sprintf(format, args...)})
}

// parseJSON reads one JSON document. It returns *Error for anything but
// well-formed JSON within the limits.
func parseJSON(src string, maxNodes, maxDepth int) (n *jnode, err error) {
	r := &jsonReader{src: src, maxNodes: maxNodes, maxDepth: maxDepth}
	defer func() {
		if e := recover(); e != nil {
			je, ok := e.(jsonError)
			if !ok {
				panic(e)
			}
			n, err = nil, &Error{Msg: je.msg}
		}
	}()
	n = r.value(0)
	r.ws()
	if r.i != len(r.src) {
		r.fail("is not valid JSON")
	}
	return n, nil
}

func (r *jsonReader) ws() {
	for r.i < len(r.src) {
		switch r.src[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

func (r *jsonReader) value(depth int) *jnode {
	if r.nodes++; r.nodes > r.maxNodes {
		r.fail("has more than %d JSON values (limit on schema size)", r.maxNodes)
	}
	r.ws()
	if r.i >= len(r.src) {
		r.fail("is not valid JSON")
	}
	switch c := r.src[r.i]; {
	case c == '{':
		if depth >= r.maxDepth {
			r.fail("nests objects and arrays more than %d deep", r.maxDepth)
		}
		r.i++
		n := &jnode{kind: 'o'}
		r.ws()
		if r.i < len(r.src) && r.src[r.i] == '}' {
			r.i++
			return n
		}
		for {
			r.ws()
			if r.i >= len(r.src) || r.src[r.i] != '"' {
				r.fail("is not valid JSON")
			}
			k, lone := r.string()
			r.ws()
			if r.i >= len(r.src) || r.src[r.i] != ':' {
				r.fail("is not valid JSON")
			}
			r.i++
			v := r.value(depth + 1)
			n.keys, n.lones, n.vals = append(n.keys, k), append(n.lones, lone), append(n.vals, v)
			r.ws()
			if r.i < len(r.src) && r.src[r.i] == ',' {
				r.i++
				continue
			}
			if r.i < len(r.src) && r.src[r.i] == '}' {
				r.i++
				return n
			}
			r.fail("is not valid JSON")
		}
	case c == '[':
		if depth >= r.maxDepth {
			r.fail("nests objects and arrays more than %d deep", r.maxDepth)
		}
		r.i++
		n := &jnode{kind: 'a'}
		r.ws()
		if r.i < len(r.src) && r.src[r.i] == ']' {
			r.i++
			return n
		}
		for {
			n.vals = append(n.vals, r.value(depth+1))
			r.ws()
			if r.i < len(r.src) && r.src[r.i] == ',' {
				r.i++
				continue
			}
			if r.i < len(r.src) && r.src[r.i] == ']' {
				r.i++
				return n
			}
			r.fail("is not valid JSON")
		}
	case c == '"':
		s, lone := r.string()
		return &jnode{kind: 's', str: s, lone: lone}
	case c == '-' || c >= '0' && c <= '9':
		start := r.i
		r.i++
		for r.i < len(r.src) && strings.IndexByte("0123456789.eE+-", r.src[r.i]) >= 0 {
			r.i++
		}
		lit := r.src[start:r.i]
		if !validNumber(lit) {
			r.fail("is not valid JSON")
		}
		return &jnode{kind: 'n', str: lit}
	case strings.HasPrefix(r.src[r.i:], "true"):
		r.i += 4
		return &jnode{kind: 'b', b: true}
	case strings.HasPrefix(r.src[r.i:], "false"):
		r.i += 5
		return &jnode{kind: 'b'}
	case strings.HasPrefix(r.src[r.i:], "null"):
		r.i += 4
		return &jnode{kind: 'z'}
	}
	r.fail("is not valid JSON")
	return nil
}

// validNumber checks JSON's number grammar.
func validNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - j
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

// string reads a JSON string at r.i (the opening quote) and reports whether
// it had a lone surrogate escape.
func (r *jsonReader) string() (string, bool) {
	r.i++
	start := r.i
	// Fast path: no escapes.
	for r.i < len(r.src) {
		c := r.src[r.i]
		if c == '"' {
			s := r.src[start:r.i]
			r.i++
			if !utf8.ValidString(s) {
				r.fail("is not valid UTF-8")
			}
			return s, false
		}
		if c == '\\' || c < 0x20 {
			break
		}
		r.i++
	}
	var b strings.Builder
	b.WriteString(r.src[start:r.i])
	lone := false
	for {
		if r.i >= len(r.src) {
			r.fail("is not valid JSON")
		}
		c := r.src[r.i]
		switch {
		case c == '"':
			r.i++
			s := b.String()
			if !utf8.ValidString(s) {
				r.fail("is not valid UTF-8")
			}
			return s, lone
		case c < 0x20:
			r.fail("is not valid JSON (control character in a string)")
		case c != '\\':
			b.WriteByte(c)
			r.i++
			continue
		}
		if r.i+1 >= len(r.src) {
			r.fail("is not valid JSON")
		}
		e := r.src[r.i+1]
		r.i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			c1 := r.hex4()
			if utf16.IsSurrogate(c1) {
				if c1 < 0xDC00 && strings.HasPrefix(r.src[r.i:], `\u`) {
					save := r.i
					r.i += 2
					c2 := r.hex4()
					if c2 >= 0xDC00 && c2 <= 0xDFFF {
						b.WriteRune(utf16.DecodeRune(c1, c2))
						continue
					}
					r.i = save
				}
				lone = true
				b.WriteRune(utf8.RuneError)
				continue
			}
			b.WriteRune(c1)
		default:
			r.fail("is not valid JSON (unknown escape)")
		}
	}
}

func (r *jsonReader) hex4() rune {
	if r.i+4 > len(r.src) {
		r.fail("is not valid JSON")
	}
	v, err := strconv.ParseUint(r.src[r.i:r.i+4], 16, 32)
	if err != nil {
		r.fail("is not valid JSON")
	}
	r.i += 4
	return rune(v)
}

// dumpJSON writes v compactly as nlohmann::json's dump() does (the text a
// const or enum value must be generated as), refusing lone surrogates.
func dumpJSON(b *strings.Builder, v *jnode) error {
	switch v.kind {
	case 'o':
		b.WriteByte('{')
		for i, k := range v.keys {
			if v.lones[i] {
				return fmt.Errorf("a key has a lone UTF-16 surrogate escape (\\uD800-\\uDFFF without its pair)")
			}
			if i > 0 {
				b.WriteByte(',')
			}
			pyjson.Quote(b, k)
			b.WriteByte(':')
			if err := dumpJSON(b, v.vals[i]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case 'a':
		b.WriteByte('[')
		for i, e := range v.vals {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := dumpJSON(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case 's':
		if v.lone {
			return fmt.Errorf("a string has a lone UTF-16 surrogate escape (\\uD800-\\uDFFF without its pair)")
		}
		pyjson.Quote(b, v.str)
	case 'n':
		b.WriteString(v.str)
	case 'b':
		b.WriteString(strconv.FormatBool(v.b))
	case 'z':
		b.WriteString("null")
	}
	return nil
}
