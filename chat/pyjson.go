package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// pyJSONText re-encodes the JSON text raw as Hugging Face's tojson filter writes
// it (Python's json.dumps with ensure_ascii=False): keys in their order,
// ", " and ": " between items (with indent > 0, a newline and that many
// spaces a level, "," and ": "). Numbers keep their text. Invalid JSON is
// returned unchanged.
func pyJSONText(raw []byte, indent int) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	// Decode into an order-keeping tree.
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := pyValue(dec, &b, indent, 0); err != nil {
		return string(raw)
	}
	return b.String()
}

func pyValue(dec *json.Decoder, b *strings.Builder, indent, level int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	newline := func(l int) {
		if indent > 0 {
			b.WriteString("\n" + strings.Repeat(" ", indent*l))
		}
	}
	sep := ", "
	if indent > 0 {
		sep = ","
	}
	switch t := tok.(type) {
	case json.Delim:
		obj := t == '{'
		open, end := "[", "]"
		if obj {
			open, end = "{", "}"
		}
		b.WriteString(open)
		n := 0
		for dec.More() {
			if n > 0 {
				b.WriteString(sep)
			}
			newline(level + 1)
			if obj {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				b.WriteString(pyJSONString(k.(string)) + ": ")
			}
			if err := pyValue(dec, b, indent, level+1); err != nil {
				return err
			}
			n++
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		if n > 0 {
			newline(level)
		}
		b.WriteString(end)
	case string:
		b.WriteString(pyJSONString(t))
	case json.Number:
		b.WriteString(t.String())
	case bool:
		fmt.Fprint(b, t)
	case nil:
		b.WriteString("null")
	}
	return nil
}

// pyJSONString quotes s as Python's json.dumps(s, ensure_ascii=False) does.
func pyJSONString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
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
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
