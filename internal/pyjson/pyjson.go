// Package pyjson writes JSON as Python's json.dumps(ensure_ascii=False) does, the text chat templates expect from
// Hugging Face's tojson filter: keys in their order, only ", \ and the control characters escaped, ", " and ": "
// between members (with an indent, "," and a newline). It owns the quoting rule that the chat templates, the tool
// call formats and the grammar compiler's JSON dump share.
package pyjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Format is how members are laid out: Item between members, Key between a key and its value, and, when Pretty, a
// newline and Indent once a level before each member and before the closing bracket of a non-empty container.
type Format struct {
	Item, Key, Indent string
	Pretty            bool
}

// Compact is json.dumps's default layout.
var Compact = Format{Item: ", ", Key: ": "}

// Indented is json.dumps(indent=n): "," and ": " with n spaces a level; n <= 0 is Compact.
func Indented(n int) Format {
	if n <= 0 {
		return Compact
	}
	return Format{Item: ",", Key: ": ", Indent: strings.Repeat(" ", n), Pretty: true}
}

// Member starts the i-th member (from 0) of a container whose members stand at depth.
func (f Format) Member(b *strings.Builder, i, depth int) {
	if i > 0 {
		b.WriteString(f.Item)
	}
	f.newline(b, depth)
}

// End ends a container of n members whose closing bracket stands at depth; the caller writes the bracket.
func (f Format) End(b *strings.Builder, n, depth int) {
	if n > 0 {
		f.newline(b, depth)
	}
}

func (f Format) newline(b *strings.Builder, depth int) {
	if f.Pretty {
		b.WriteByte('\n')
		for range depth {
			b.WriteString(f.Indent)
		}
	}
}

// Quote writes s as a JSON string: only ", \ and the control characters escaped, every other byte as it is (no
// \u for non-ASCII, no HTML escaping). Python's and nlohmann::json's dumps agree on this.
func Quote(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if c < 0x20 {
				fmt.Fprintf(b, `\u%04x`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// String returns s quoted as Quote writes it.
func String(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	Quote(&b, s)
	return b.String()
}

// Float formats f as Python's float repr does (json.dumps writes floats with repr).
func Float(f float64) string {
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
	// The shortest digits, as Python's repr; it writes an exponent only below 1e-4 or from 1e16 (Go's 'g' from 1e21
	// or past the digits), and both write it with a sign and at least two digits (1e-07, 1e+16).
	e := strconv.FormatFloat(f, 'e', -1, 64)
	if exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:]); exp < -4 || exp >= 16 {
		return e
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// Text re-encodes the JSON text raw in format f, keys in their order and numbers with their text. Invalid JSON is
// returned unchanged.
func Text(raw []byte, f Format) string {
	// The first value must decode whole before any of it is written; text after it is dropped.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := f.value(dec, &b, 0); err != nil {
		return string(raw)
	}
	return b.String()
}

func (f Format) value(dec *json.Decoder, b *strings.Builder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		obj := t == '{'
		end := byte(']')
		if obj {
			end = '}'
		}
		b.WriteByte(byte(t))
		n := 0
		for ; dec.More(); n++ {
			f.Member(b, n, depth+1)
			if obj {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				Quote(b, k.(string))
				b.WriteString(f.Key)
			}
			if err := f.value(dec, b, depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		f.End(b, n, depth)
		b.WriteByte(end)
	case string:
		Quote(b, t)
	case json.Number:
		b.WriteString(t.String())
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case nil:
		b.WriteString("null")
	}
	return nil
}
