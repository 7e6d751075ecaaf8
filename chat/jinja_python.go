package chat

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/parley-chat/parley/internal/pyjson"
)

// Helpers that the prepared source calls (see prepareSource) so that values print as Python's str() does, and
// that a render refuses a recursion without end.

// pyPrint is {{ x }}: Python's str(x) (None as None, True, 1.0, lists and dicts as their repr); an undefined value
// prints nothing.
func pyPrint(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 || args[0].IsUndefined() || args[0].IsCallable() {
		return jinja.NewString(""), nil
	}
	if args[0].IsString() {
		return args[0], nil
	}
	return jinja.NewString(pyStr(args[0])), nil
}

// pyString is the string filter: Python's str(x).
func pyString(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 || args[0].IsUndefined() {
		return jinja.NewString(""), nil
	}
	return jinja.NewString(pyStr(args[0])), nil
}

// pyStr is Python's str(v).
func pyStr(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return pyRepr(v)
}

// pyRepr is Python's repr(v).
func pyRepr(v jinja.Value) string {
	switch {
	case v.IsNone(), v.IsUndefined():
		return "None"
	case v.IsBool():
		if v.AsBool() {
			return "True"
		}
		return "False"
	case v.IsInt():
		return strconv.FormatInt(v.AsInt(), 10)
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case math.IsNaN(f):
			return "nan"
		case math.IsInf(f, 1):
			return "inf"
		case math.IsInf(f, -1):
			return "-inf"
		}
		return pyjson.Float(f)
	case v.IsString():
		return pyQuote(v.AsString())
	case v.IsList():
		var b strings.Builder
		b.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(it))
		}
		b.WriteByte(']')
		return b.String()
	case v.IsDict():
		d := v.AsDict()
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(pyKeyValue(k)))
			b.WriteString(": ")
			b.WriteString(pyRepr(d.Data[k]))
		}
		b.WriteByte('}')
		return b.String()
	}
	return v.String()
}

// pyQuote is Python's repr of a str: single quotes, or double quotes when s holds a single quote and no double
// quote; backslash, the quote and control characters escaped.
func pyQuote(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == '\\' || r == rune(quote):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}

// maxRenderFrames bounds the Go stack of a render, in frames, checked at each macro call (pyEnter). A macro level
// costs the engine about a dozen frames, so this allows some 300 levels, more than jinja2's Python allows (it
// raises RecursionError near 200 levels of a simple recursive macro); real templates nest a few.
const maxRenderFrames = 4000

// pyEnter is the default of the parameter prepareSource adds to every macro, so the engine calls it at each macro
// call: past maxRenderFrames it fails the render with errRecursion, at once, where a recursion without end would
// grow the stack until the process dies (or the sandbox's time limit ends it).
func pyEnter(_ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var pcs [maxRenderFrames + 1]uintptr
	if n := runtime.Callers(0, pcs[:]); n > maxRenderFrames {
		return jinja.Undefined(), fmt.Errorf("%w: macro calls nested more than %d frames deep", errRecursion, maxRenderFrames)
	}
	return jinja.None(), nil
}

// maxRange is the longest range() a template may make: jinja2's sandbox (Hugging Face renders in one) refuses a
// longer one with OverflowError (MAX_RANGE), so a template cannot loop a hundred million times through range.
const maxRange = 100000

// pyRange is range() with jinja2's sandbox limit; it shadows the engine's builtin (variables come first).
func pyRange(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var start, stop, step int64 = 0, 0, 1
	ints := make([]int64, len(args))
	for i, a := range args {
		switch {
		case a.IsInt():
			ints[i] = a.AsInt()
		case a.IsBool() && a.AsBool():
			ints[i] = 1
		case a.IsBool():
		default:
			return jinja.Undefined(), fmt.Errorf("range: %s is not an integer", a.String())
		}
	}
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range: expected 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return jinja.Undefined(), fmt.Errorf("range: step must not be zero")
	}
	var n int64
	switch {
	case step > 0 && stop > start:
		n = (stop - start + step - 1) / step
	case step < 0 && stop < start:
		n = (start - stop - step - 1) / -step
	}
	if n > maxRange {
		return jinja.Undefined(), fmt.Errorf("%w: range too big, the sandbox blocks ranges larger than MAX_RANGE (%d)", ErrTemplateLimit, maxRange)
	}
	items := make([]jinja.Value, 0, n)
	for i := range n {
		items = append(items, jinja.NewInt(start+i*step))
	}
	return jinja.NewList(items), nil
}

// pyFormat is jinja2's format filter, Python's printf-style `value % args`: %s (str), %r (repr), %d and %i,
// %f with a precision, %x, %o, %% and flags/width as Python reads them. A template's %(name)s takes the keyword
// arguments.
func pyFormat(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("format: no format string")
	}
	f := pyStr(args[0])
	rest := args[1:]
	var b strings.Builder
	next := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			b.WriteByte(f[i])
			continue
		}
		i++
		if i == len(f) {
			return jinja.Undefined(), fmt.Errorf("format: incomplete format")
		}
		if f[i] == '%' {
			b.WriteByte('%')
			continue
		}
		var arg jinja.Value
		keyed := f[i] == '('
		if keyed {
			end := strings.IndexByte(f[i:], ')')
			if end < 0 {
				return jinja.Undefined(), fmt.Errorf("format: incomplete format key")
			}
			v, ok := kwargs[f[i+1:i+end]]
			if !ok {
				return jinja.Undefined(), fmt.Errorf("format: key %q not given", f[i+1:i+end])
			}
			arg = v
			i += end + 1
		}
		start := i
		for i < len(f) && strings.IndexByte("#0- +.0123456789", f[i]) >= 0 {
			i++
		}
		if i == len(f) {
			return jinja.Undefined(), fmt.Errorf("format: incomplete format")
		}
		spec, verb := f[start:i], f[i]
		if !keyed {
			if next >= len(rest) {
				return jinja.Undefined(), fmt.Errorf("format: not enough arguments for format string")
			}
			arg = rest[next]
			next++
		}
		switch verb {
		case 's':
			fmt.Fprintf(&b, "%"+spec+"s", pyStr(arg))
		case 'r':
			fmt.Fprintf(&b, "%"+spec+"s", pyRepr(arg))
		case 'd', 'i', 'u':
			fmt.Fprintf(&b, "%"+spec+"d", pyInt(arg))
		case 'f', 'F', 'e', 'E', 'g', 'G':
			if !strings.Contains(spec, ".") && (verb == 'f' || verb == 'F' || verb == 'e' || verb == 'E') {
				spec += ".6"
			}
			fmt.Fprintf(&b, "%"+spec+string(verb), pyFloat(arg))
		case 'x', 'X', 'o':
			fmt.Fprintf(&b, "%"+spec+string(verb), pyInt(arg))
		case 'c':
			b.WriteString(pyStr(arg))
		default:
			return jinja.Undefined(), fmt.Errorf("format: unsupported format character %q", verb)
		}
	}
	if next < len(rest) {
		return jinja.Undefined(), fmt.Errorf("format: not all arguments converted during string formatting")
	}
	return jinja.NewString(b.String()), nil
}

// pyInt and pyFloat read a number for the format filter (a bool as 0 or 1, anything else as 0).
func pyInt(v jinja.Value) int64 {
	i, f, isFloat, _ := pyNum(v)
	if isFloat {
		return int64(f)
	}
	return i
}

func pyFloat(v jinja.Value) float64 {
	_, f, _, _ := pyNum(v)
	return f
}
