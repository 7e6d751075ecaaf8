package chatsocket

import "github.com/parley-chat/parley"

// A reasoning model's thought on the chat socket. JSON mode sends it as "thinking" messages, before the answer's
// "token" messages, and whole in the done message's "thinking". Text mode (the seed contract: the answer's pieces,
// then the sentinel) sends the answer only, unless the client connected with ?thinking=show: then the thought's
// pieces come first, between a "<think>" frame and a "</think>" frame, so a person and a program can tell it apart.

// ThinkOpen and ThinkClose are the text frames that enclose a thought in text mode with ?thinking=show.
const (
	ThinkOpen  = "<think>"
	ThinkClose = "</think>\n"
)

// showThinking reads the thinking query parameter: show (or 1, true) shows the thought in text mode.
func showThinking(v string) bool {
	switch v {
	case "show", "1", "true", "on":
		return true
	}
	return false
}

// thoughtMarks tracks whether text mode has opened a thought, to close it before the answer.
type thoughtMarks struct{ open bool }

// pieces returns the text frames of one token in text mode.
func (m *thoughtMarks) pieces(t parley.Token, show bool) []string {
	var out []string
	if show && t.Reasoning != "" {
		if !m.open {
			m.open = true
			out = append(out, ThinkOpen)
		}
		out = append(out, t.Reasoning)
	}
	if t.Text != "" {
		if m.open {
			m.open = false
			out = append(out, ThinkClose)
		}
		out = append(out, t.Text)
	}
	return out
}

// close returns the frame that closes a thought still open at the end of the reply, or "".
func (m *thoughtMarks) close() string {
	if m.open {
		m.open = false
		return ThinkClose
	}
	return ""
}
