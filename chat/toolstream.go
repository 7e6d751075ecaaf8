package chat

import (
	"crypto/rand"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/parley-chat/parley"
)

// maxCallHead bounds the text between a call's trigger and its arguments
// ({"name": "...", "arguments": ) in bytes: a tool name is at most 64 bytes,
// so past this the text is not a call and is released as content.
const maxCallHead = 256

// toolStream splits a reply's text into content and tool calls as it is
// generated, for a family's syntax. Text before a call's trigger is content
// (a possible trigger prefix is held back); from the trigger on, the head
// {"name": "...", "arguments": gives the call's name, and the arguments
// stream as they are written until their JSON value is complete. Under the
// call grammar the text always has this shape; text that does not (a model
// writing freely) goes back to content. Not safe for concurrent use.
type toolStream struct {
	syn   parley.ToolSyntax
	tools map[string]parley.Tool
	// rejected counts complete calls whose arguments did not validate (left
	// out of Calls).
	rejected int
	head     *regexp.Regexp

	state   int
	trigger string // the trigger text a call's head follows ("" for a forced call's)
	pending string // text not yet given out: a possible trigger prefix, a call's head, or its tail
	calls   []parley.ToolCall
	cur     *parley.ToolCall
	// The arguments' JSON scanner.
	depth          int
	inStr, escaped bool
}

const (
	tsText  = iota // content
	tsHead         // after the trigger, before the arguments
	tsArgs         // inside the arguments
	tsClose        // after the arguments: the call object's "}" and the syntax's Close
)

// newToolStream returns the splitter of a reply that may call tools; forced
// says the reply starts with a call (Open, or the call object itself).
func newToolStream(syn parley.ToolSyntax, tools []parley.Tool, forced bool) *toolStream {
	ts := &toolStream{syn: syn, tools: map[string]parley.Tool{}}
	for _, t := range tools {
		ts.tools[t.Name] = t
	}
	key := syn.ArgsKey
	if key == "" {
		key = "arguments"
	}
	rest := ""
	if strings.HasPrefix(syn.Open, syn.Trigger) {
		rest = syn.Open[len(syn.Trigger):]
	}
	ts.head = regexp.MustCompile(`^\s*(?:` + regexp.QuoteMeta(strings.TrimSpace(rest)) + `)?\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"` +
		regexp.QuoteMeta(key) + `"\s*:\s*`)
	if forced && (syn.Open == "" || !strings.HasPrefix(syn.Open, syn.Trigger)) {
		// The grammar writes the call object first (or an Open that is
		// not the trigger, which the head pattern allows before it).
		ts.state = tsHead
	}
	return ts
}

// wants reports whether a special token's text belongs to the stream (it
// is inside a call, or is the trigger), rather than being dropped.
func (ts *toolStream) wants(text string) bool {
	return ts.state != tsText || strings.Contains(text, ts.syn.Trigger)
}

// Push takes the next piece of reply text and returns the content that is
// safe to show and the tool-call delta it made (nil for none).
func (ts *toolStream) Push(text string) (content string, delta *parley.ToolCallDelta) {
	var out strings.Builder
	ts.pending += text
	for ts.pending != "" {
		progressed := false
		switch ts.state {
		case tsText:
			progressed = ts.text(&out)
		case tsHead:
			progressed = ts.callHead(&out, &delta)
		case tsArgs:
			progressed = ts.args(&delta)
		case tsClose:
			progressed = ts.close()
		}
		if !progressed {
			break
		}
	}
	return out.String(), delta
}

// text gives out content up to a trigger (then enters the head) or up to a
// possible trigger prefix at the end.
func (ts *toolStream) text(out *strings.Builder) bool {
	trig := ts.syn.Trigger
	if i := strings.Index(ts.pending, trig); i >= 0 && trig != "" {
		out.WriteString(ts.pending[:i])
		ts.pending = ts.pending[i+len(trig):]
		ts.state, ts.trigger = tsHead, trig
		return true
	}
	keep := 0
	for k := min(len(trig)-1, len(ts.pending)); k > 0; k-- {
		if strings.HasSuffix(ts.pending, trig[:k]) {
			keep = k
			break
		}
	}
	out.WriteString(ts.pending[:len(ts.pending)-keep])
	ts.pending = ts.pending[len(ts.pending)-keep:]
	return false
}

// callHead waits for {"name": "...", "arguments": and starts the call.
func (ts *toolStream) callHead(out *strings.Builder, delta **parley.ToolCallDelta) bool {
	m := ts.head.FindStringSubmatchIndex(ts.pending)
	if m == nil {
		if len(ts.pending) > maxCallHead {
			// Not a call: the trigger and what followed are content.
			out.WriteString(ts.trigger + ts.pending)
			ts.pending, ts.state, ts.trigger = "", tsText, ""
			return true
		}
		return false
	}
	var name string
	if json.Unmarshal([]byte(ts.pending[m[2]:m[3]]), &name) != nil || !ts.known(name) {
		out.WriteString(ts.trigger + ts.pending)
		ts.pending, ts.state, ts.trigger = "", tsText, ""
		return true
	}
	ts.cur = &parley.ToolCall{ID: callID(), Name: name}
	ts.pending, ts.trigger = ts.pending[m[1]:], ""
	ts.state, ts.depth, ts.inStr, ts.escaped = tsArgs, 0, false, false
	*delta = &parley.ToolCallDelta{Index: len(ts.calls), ID: ts.cur.ID, Name: name}
	return true
}

// args streams the arguments until their JSON value ends.
func (ts *toolStream) args(delta **parley.ToolCallDelta) bool {
	if ts.cur.Arguments == "" {
		// Whitespace before the value is the head's, whichever piece brought it.
		if ts.pending = strings.TrimLeft(ts.pending, " \t\n"); ts.pending == "" {
			return false
		}
	}
	end := -1
	for i := 0; i < len(ts.pending) && end < 0; i++ {
		c := ts.pending[i]
		switch {
		case ts.inStr:
			switch {
			case ts.escaped:
				ts.escaped = false
			case c == '\\':
				ts.escaped = true
			case c == '"':
				ts.inStr = false
			}
		case c == '"':
			ts.inStr = true
		case c == '{' || c == '[':
			ts.depth++
		case c == '}' || c == ']':
			ts.depth--
			if ts.depth == 0 {
				end = i + 1
			}
		}
	}
	piece := ts.pending
	if end >= 0 {
		piece = ts.pending[:end]
	}
	ts.cur.Arguments += piece
	if *delta == nil {
		*delta = &parley.ToolCallDelta{Index: len(ts.calls)}
	}
	(*delta).Arguments += piece
	ts.pending = ts.pending[len(piece):]
	if end < 0 {
		return false
	}
	ts.state = tsClose
	return true
}

// close consumes the call object's "}" and the syntax's Close (whitespace
// around them is free); the call is complete at the "}". Text that is
// neither goes back to content.
func (ts *toolStream) close() bool {
	s := strings.TrimLeft(ts.pending, " \t\n")
	if ts.cur != nil {
		if s == "" {
			return false
		}
		if s[0] == '}' {
			if validArguments(ts.tools[ts.cur.Name], ts.cur.Arguments) == nil {
				ts.calls = append(ts.calls, *ts.cur)
			} else {
				ts.rejected++
			}
			s = s[1:]
		}
		ts.cur = nil
	}
	want := strings.TrimLeft(ts.syn.Close, " \t\n")
	s2 := strings.TrimLeft(s, " \t\n")
	n := commonPrefix(want, s2)
	switch {
	case n == len(want):
		ts.pending, ts.state = s2[n:], tsText
		return true
	case n == len(s2):
		ts.pending = s
		return false // a prefix of the close so far
	}
	ts.pending, ts.state = s, tsText
	return true
}

// Flush ends the stream: held text that was not a call is content.
func (ts *toolStream) Flush() string {
	s := ""
	if ts.state == tsText || ts.state == tsHead {
		s = ts.trigger + ts.pending
	}
	ts.pending, ts.trigger = "", ""
	return s
}

// Calls returns the calls completed so far (their arguments are valid JSON).
func (ts *toolStream) Calls() []parley.ToolCall { return ts.calls }

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// callID returns a fresh tool-call id, "call_" and 24 letters and digits.
func callID() string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return "call_" + string(b)
}

func (ts *toolStream) known(name string) bool {
	_, ok := ts.tools[name]
	return ok
}
