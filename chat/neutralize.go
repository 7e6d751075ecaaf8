package chat

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/parley-chat/parley"
)

// Control-token text is text wherever a client writes it.
//
// The tokenizer turns special-token text (such as "<|im_start|>", "</s>" or
// a user-defined "<tool_call>") into the token itself anywhere in the
// rendered prompt, so a client that typed a role marker could speak as the
// system, end the prompt early or forge a tool call. Only the template's own
// markup may produce special tokens: every string a client supplies that
// reaches the prompt (message contents, reasoning, names, tool call ids,
// names and arguments, tool names, descriptions and schemas: keys, enum
// values, descriptions, defaults) is neutralized first, by a zero-width
// space after the first character of each special token's text. Inside JSON
// (schemas, arguments) the strings are neutralized once decoded, so an
// escape such as \u003c or \/ cannot spell a token that the template's
// tojson would write out whole.

// neutralize returns msgs with every client-written string neutralized
// (see above); msgs itself is not changed, and is returned as it is when
// nothing needed it.
func neutralize(msgs []parley.Message, controls []string) []parley.Message {
	if len(controls) == 0 {
		return msgs
	}
	var out []parley.Message
	for i, m := range msgs {
		n := neutralizeMessage(m, controls)
		if n.Content != m.Content || n.Reasoning != m.Reasoning || n.Name != m.Name || n.ToolCallID != m.ToolCallID || !sameCalls(n.ToolCalls, m.ToolCalls) {
			if out == nil {
				out = append([]parley.Message(nil), msgs...)
			}
			out[i] = n
		}
	}
	if out == nil {
		return msgs
	}
	return out
}

func neutralizeMessage(m parley.Message, controls []string) parley.Message {
	m.Content, m.Images = neutralizeContent(m, controls)
	m.Reasoning = neutralizeText(m.Reasoning, controls)
	m.Name = neutralizeText(m.Name, controls)
	m.ToolCallID = neutralizeText(m.ToolCallID, controls)
	var calls []parley.ToolCall
	for i, c := range m.ToolCalls {
		n := parley.ToolCall{ID: neutralizeText(c.ID, controls), Name: neutralizeText(c.Name, controls),
			Arguments: string(neutralizeJSON([]byte(c.Arguments), controls))}
		if n != c {
			if calls == nil {
				calls = append([]parley.ToolCall(nil), m.ToolCalls...)
			}
			calls[i] = n
		}
	}
	if calls != nil {
		m.ToolCalls = calls
	}
	return m
}

// neutralizeContent returns m's content neutralized and its images with their offsets in it (m.Images itself
// when none moved): each piece of text between images on its own, so that every image keeps its place.
func neutralizeContent(m parley.Message, controls []string) (string, []parley.ImagePart) {
	moved := false
	for _, im := range m.Images {
		moved = moved || im.Offset > 0
	}
	if !moved {
		return neutralizeText(m.Content, controls), m.Images
	}
	segs := parley.ContentSegments(m)
	var b strings.Builder
	images := append([]parley.ImagePart(nil), m.Images...)
	for i, seg := range segs {
		b.WriteString(neutralizeText(seg, controls))
		if i < len(images) {
			images[i].Offset = b.Len()
		}
	}
	if b.String() == m.Content {
		return m.Content, m.Images
	}
	return b.String(), images
}

// sameCalls reports whether a and b are the same slice of calls (neutralize
// copies a message's calls only when one changed).
func sameCalls(a, b []parley.ToolCall) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// neutralizeTools returns tools with their names, descriptions and schemas
// neutralized (see above), copied only when one changed.
func neutralizeTools(tools []parley.Tool, controls []string) []parley.Tool {
	if len(controls) == 0 {
		return tools
	}
	var out []parley.Tool
	for i, t := range tools {
		n := parley.Tool{Name: neutralizeText(t.Name, controls), Description: neutralizeText(t.Description, controls),
			Parameters: neutralizeJSON(t.Parameters, controls)}
		if n.Name != t.Name || n.Description != t.Description || !bytes.Equal(n.Parameters, t.Parameters) {
			if out == nil {
				out = append([]parley.Tool(nil), tools...)
			}
			out[i] = n
		}
	}
	if out == nil {
		return tools
	}
	return out
}

// neutralizeText breaks up every special token's text in s (see above).
func neutralizeText(s string, controls []string) string {
	for _, tok := range controls {
		if strings.Contains(s, tok) {
			_, size := utf8.DecodeRuneInString(tok)
			s = strings.ReplaceAll(s, tok, tok[:size]+"\u200b"+tok[size:])
		}
	}
	return s
}

// neutralizeJSON returns raw with every string in it (keys included)
// neutralized once decoded, re-encoded in the same order; raw as it is when
// no string can hold a token's text. Text that is not JSON is neutralized as
// text.
func neutralizeJSON(raw []byte, controls []string) []byte {
	if len(raw) == 0 {
		return raw
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		// No escapes: every decoded string is a piece of raw.
		found := false
		for _, tok := range controls {
			if bytes.Contains(raw, []byte(tok)) {
				found = true
				break
			}
		}
		if !found {
			return raw
		}
	}
	out, ok := rewriteJSONStrings(raw, func(s string) string { return neutralizeText(s, controls) })
	if !ok {
		return []byte(neutralizeText(string(raw), controls))
	}
	return out
}

// rewriteJSONStrings re-encodes the JSON text raw with every string (keys
// included) passed through f, keeping the order of keys and the text of
// numbers; false when raw is not one JSON value.
func rewriteJSONStrings(raw []byte, f func(string) string) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	type frame struct {
		obj bool
		n   int // keys and values written in it
	}
	var stack []frame
	sep := func() {
		if len(stack) == 0 {
			return
		}
		top := stack[len(stack)-1]
		switch {
		case top.obj && top.n%2 == 1:
			out.WriteByte(':')
		case top.n > 0:
			out.WriteByte(',')
		}
	}
	written := func() {
		if len(stack) > 0 {
			stack[len(stack)-1].n++
		}
	}
	values := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, false
		}
		if len(stack) == 0 {
			if values++; values > 1 {
				return nil, false
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				sep()
				out.WriteByte(byte(v))
				stack = append(stack, frame{obj: v == '{'})
				continue
			}
			out.WriteByte(byte(v))
			stack = stack[:len(stack)-1]
		case string:
			sep()
			if err := enc.Encode(f(v)); err != nil {
				return nil, false
			}
			out.Truncate(out.Len() - 1) // Encode's newline
		case json.Number:
			sep()
			out.WriteString(v.String())
		case bool:
			sep()
			if v {
				out.WriteString("true")
			} else {
				out.WriteString("false")
			}
		case nil:
			sep()
			out.WriteString("null")
		}
		written()
	}
	if values != 1 || len(stack) != 0 {
		return nil, false
	}
	return out.Bytes(), true
}
