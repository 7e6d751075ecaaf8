package chat

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The Jinja library's tojson with indent= sorts keys and escapes <, > and & (Go's encoding/json), where Hugging
// Face's tojson (Python's json.dumps with ensure_ascii=False) keeps insertion order and writes them as they are:
// Llama 3.x and Granite write their tool prompts with tojson(indent=4). The library looks builtin filters up before
// the template's variables, so the source is rewritten to call pyTojsonFilter, passed as a variable, instead.

// pyTojsonName is the filter the rewritten source calls; a name no real template uses.
const pyTojsonName = "parley_tojson"

var tojsonIndent = regexp.MustCompile(`\btojson\s*\(\s*indent\b`)

// rewriteSource returns src with every tojson(indent=...) calling pyTojsonName.
func rewriteSource(src string) string {
	return tojsonIndent.ReplaceAllString(src, pyTojsonName+"(indent")
}

// pyTojson is Hugging Face's tojson filter: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys).
func pyTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	e := pyJSON{item: ", ", key: ": "}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			e.indent, e.pretty = strings.Repeat(" ", int(min(max(v.AsInt(), 0), 64))), true
		case v.IsString():
			e.indent, e.pretty = v.AsString(), true
		}
		e.item = ","
	}
	if v, ok := kwargs["separators"]; ok && v.IsList() && v.AsList().Len() == 2 {
		it := v.AsList().Items
		if it[0].IsString() && it[1].IsString() {
			e.item, e.key = it[0].AsString(), it[1].AsString()
		}
	}
	if v, ok := kwargs["sort_keys"]; ok {
		e.sort = v.IsTruthy()
	}
	var b strings.Builder
	if err := e.encode(&b, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

type pyJSON struct {
	item, key, indent string
	pretty, sort      bool
}

func (e *pyJSON) newline(b *strings.Builder, depth int) {
	if e.pretty {
		b.WriteByte('\n')
		for range depth {
			b.WriteString(e.indent)
		}
	}
}

func (e *pyJSON) encode(b *strings.Builder, v jinja.Value, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("tojson: nested deeper than %d levels", maxJSONDepth)
	}
	switch {
	case v.IsNone(), v.IsUndefined():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		pyQuote(b, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(e.item)
			}
			e.newline(b, depth+1)
			if err := e.encode(b, it, depth+1); err != nil {
				return err
			}
		}
		e.newline(b, depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if e.sort {
			keys = slices.Sorted(slices.Values(keys))
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(e.item)
			}
			e.newline(b, depth+1)
			pyQuote(b, k)
			b.WriteString(e.key)
			if err := e.encode(b, d.Data[k], depth+1); err != nil {
				return err
			}
		}
		e.newline(b, depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot encode %s", v.String())
	}
	return nil
}

// pyFloat formats f as Python's float repr does (json.dumps writes floats with repr).
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e16 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64) // the shortest repr, as Python's; exponents agree (1e-07, 1e+16)
}

// pyQuote writes s as a JSON string the way Python's json.dumps(ensure_ascii=False) does: only ", \ and the
// control characters escaped.
func pyQuote(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}
