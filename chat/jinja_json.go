package chat

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/parley-chat/parley/internal/pyjson"
)

// The Jinja library's tojson with indent= sorts keys and escapes <, > and & (Go's encoding/json), where Hugging
// Face's tojson (Python's json.dumps with ensure_ascii=False) keeps insertion order and writes them as they are:
// Llama 3.x and Granite write their tool prompts with tojson(indent=4). The prepared source makes every tojson call
// pyTojson (pyTojsonName) instead.

// pyTojson is Hugging Face's tojson filter: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys).
func pyTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	e := pyJSON{Format: pyjson.Compact}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			e.Indent, e.Pretty = strings.Repeat(" ", int(min(max(v.AsInt(), 0), 64))), true
		case v.IsString():
			e.Indent, e.Pretty = v.AsString(), true
		}
		e.Item = ","
	}
	if v, ok := kwargs["separators"]; ok && v.IsList() && v.AsList().Len() == 2 {
		it := v.AsList().Items
		if it[0].IsString() && it[1].IsString() {
			e.Item, e.Key = it[0].AsString(), it[1].AsString()
		}
	}
	if v, ok := kwargs["sort_keys"]; ok {
		e.sort = v.IsTruthy()
	}
	if v, ok := kwargs["ensure_ascii"]; ok {
		e.ascii = v.IsTruthy()
	}
	var b strings.Builder
	if err := e.encode(&b, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

type pyJSON struct {
	pyjson.Format
	sort  bool
	ascii bool // ensure_ascii: every character outside ' '..'~' as \uXXXX
}

// quote writes s as a JSON string; with ensure_ascii, Python's way: \uXXXX (lower-case hex) for every character
// outside ' '..'~', a surrogate pair for one past U+FFFF.
func (e *pyJSON) quote(b *strings.Builder, s string) {
	if !e.ascii {
		pyjson.Quote(b, s)
		return
	}
	var q strings.Builder
	pyjson.Quote(&q, s)
	for _, r := range q.String() {
		switch {
		case r >= ' ' && r <= '~':
			b.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			fmt.Fprintf(b, `\u%04x`, r)
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
		b.WriteString(pyjson.Float(v.AsFloat()))
	case v.IsString():
		e.quote(b, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			e.Member(b, i, depth+1)
			if err := e.encode(b, it, depth+1); err != nil {
				return err
			}
		}
		e.End(b, len(items), depth)
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
			e.Member(b, i, depth+1)
			e.quote(b, pyStr(pyKeyValue(k))) // json.dumps writes an int key as its digits
			b.WriteString(e.Key)
			if err := e.encode(b, d.Data[k], depth+1); err != nil {
				return err
			}
		}
		e.End(b, len(keys), depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot encode %s", v.String())
	}
	return nil
}
