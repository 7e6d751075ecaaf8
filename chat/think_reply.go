package chat

import "github.com/parley-chat/parley"

// ThinkFormatOf returns the thought format of a template: a Jinja template's, detected from its source; none for
// the hand-written families.
func ThinkFormatOf(t Template) ThinkFormat {
	if j, ok := t.(*Jinja); ok {
		return j.ThinkFormat()
	}
	return ThinkNone
}

// thoughtSplit is a Reply's splitting of a reasoning model's stream: the Splitter, the Streamer that cleans the
// thought (the answer's is the Reply's own), and the count of the thought's tokens.
type thoughtSplit struct {
	format ThinkFormat
	split  *Splitter
	st     *Streamer // the thought's: whole UTF-8 characters; a stop string inside the thought ends the reply too
	tokens int
}

// push routes one token's text: the thought's part into tok.Reasoning, the answer's into tok.Text, each cleaned by
// its Streamer (answer: st). stopped reports that a stop string matched in either.
func (s *thoughtSplit) push(tok parley.Token, st textSink) (parley.Token, bool) {
	was := s.split.Thinking()
	thought, answer := s.split.Push(tok.Text)
	if was || s.split.Thinking() {
		s.tokens++
	}
	var stopT, stopA bool
	tok.Reasoning, stopT = s.st.Push(thought)
	tok.Text = ""
	if !stopT {
		tok.Text, stopA = st.Push(answer)
	}
	return tok, stopT || stopA
}

// flush adds what the splitter and the thought's Streamer hold at the end to tok.
func (s *thoughtSplit) flush(tok parley.Token, st textSink) parley.Token {
	thought, answer := s.split.Flush()
	if r, stopped := s.st.Push(thought); !stopped {
		tok.Reasoning += r + s.st.Flush()
	} else {
		tok.Reasoning += r
	}
	a, _ := st.Push(answer)
	tok.Text += a
	return tok
}

// holding reports whether the thought's Streamer or the splitter holds text back (nil: no).
func (s *thoughtSplit) holding() bool {
	return s != nil && (s.st.holding() || s.split.held != "" || s.split.wsHeld != "")
}
