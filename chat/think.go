package chat

import (
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/parley-chat/parley/internal/pyjson"
)

// ThinkFormat is how a reasoning model marks its thought in the text it writes.
type ThinkFormat int

// Thought formats.
const (
	ThinkNone    ThinkFormat = iota // no thought: the whole reply is the answer
	ThinkTags                       // <think>thought</think>answer (Qwen3, QwQ, DeepSeek-R1, SmolLM3, GLM, Kimi, ...)
	ThinkHarmony                    // gpt-oss's channels: analysis is the thought, final (and commentary) the answer
	ThinkChannel                    // <|channel>thought ...<channel|>answer (Gemma 4)
)

func (f ThinkFormat) String() string {
	switch f {
	case ThinkTags:
		return "think-tags"
	case ThinkHarmony:
		return "harmony"
	case ThinkChannel:
		return "channel"
	}
	return "none"
}

// tags returns the marks that open and close the thought of a tag format (ThinkTags, ThinkChannel).
func (f ThinkFormat) tags() (open, close string, ok bool) {
	switch f {
	case ThinkTags:
		return thinkOpen, thinkClose, true
	case ThinkChannel:
		return channelOpen, channelClose, true
	}
	return "", "", false
}

// Thought markers.
const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"

	channelOpen  = "<|channel>thought" // Gemma 4: <|channel> is a control token, "thought" text
	channelClose = "<channel|>"

	harmonyChannel = "<|channel|>"
	harmonyMessage = "<|message|>"
	harmonyEnd     = "<|end|>"
	harmonyStart   = "<|start|>"
	harmonyReturn  = "<|return|>"
	harmonyCall    = "<|call|>"
)

var harmonyMarkers = []string{harmonyChannel, harmonyMessage, harmonyEnd, harmonyStart, harmonyReturn, harmonyCall}

// DetectThinkFormat recognises a reasoning model's thought format from its chat template's source.
func DetectThinkFormat(src string) ThinkFormat {
	switch {
	case strings.Contains(src, harmonyChannel) && strings.Contains(src, "analysis"):
		return ThinkHarmony
	case strings.Contains(src, channelOpen) && strings.Contains(src, channelClose):
		return ThinkChannel
	case strings.Contains(src, thinkOpen) && strings.Contains(src, thinkClose):
		return ThinkTags
	}
	return ThinkNone
}

// IsMarker reports whether text is one of the format's markers (a control token's text that the splitter must see).
func (f ThinkFormat) IsMarker(text string) bool {
	switch f {
	case ThinkTags:
		return text == thinkOpen || text == thinkClose
	case ThinkChannel:
		return text == "<|channel>" || text == channelClose
	case ThinkHarmony:
		for _, m := range harmonyMarkers {
			if text == m {
				return true
			}
		}
	}
	return false
}

// Splitter separates a reasoning model's streamed reply into its thought and its answer, holding back text that may
// be the start of a marker. The markers themselves appear in neither. Not safe for concurrent use.
type Splitter struct {
	format      ThinkFormat
	open, close string // a tag format's marks
	held        string // text not yet routed: a possible marker's start, or a harmony header
	// Tags: the state is before (a thought may open), in (thinking), after (answering; no further thought).
	state splitState
	// Harmony: inBody is false while reading a message's header (up to <|message|>); thought says its channel is
	// analysis.
	inBody  bool
	thought bool
	// Harmony: calls says the reply may call tools, so that a message to a function (to=functions.NAME in its
	// header) is a call; inCall says the body being read is one (see harmonyToolSyntax). When the reply may not
	// call, such a message is dropped (toFunc), as other families' replies end at a call's trigger then.
	calls, inCall, toFunc bool
	callBody              strings.Builder // the call's arguments so far
	// trim: whitespace at the start of the thought or of the answer after a thought is dropped, and whitespace at
	// the thought's end; wsHeld is whitespace inside the thought waiting for what follows it.
	trimLeft bool
	wsHeld   string
}

type splitState int

const (
	before splitState = iota
	in
	after
)

// maxHarmonyHeader bounds a harmony message header (<|channel|>analysis to=functions.x <|constrain|>json), in bytes:
// a longer one is not a header and is routed as answer text.
const maxHarmonyHeader = 256

// NewSplitter returns a splitter for a reply that continues prompt (the rendered prompt decides where the reply
// starts: a prompt ending with <think> starts inside the thought, one ending with </think> after it).
func NewSplitter(format ThinkFormat, prompt string) *Splitter {
	s := &Splitter{format: format}
	if open, close, ok := format.tags(); ok {
		s.open, s.close = open, close
		tail := strings.TrimRightFunc(prompt, unicode.IsSpace)
		switch {
		case strings.HasSuffix(tail, open):
			s.state, s.trimLeft = in, true
		case strings.HasSuffix(tail, close):
			s.state, s.trimLeft = after, true
		}
	}
	return s
}

// Thinking reports whether the reply is inside its thought (the next text is the thought's).
func (s *Splitter) Thinking() bool {
	if s.format == ThinkHarmony {
		return s.inBody && s.thought
	}
	return s.state == in
}

// Push routes text (a token's piece, a marker's text included) and returns what is now known to be thought and
// answer.
func (s *Splitter) Push(text string) (thought, answer string) {
	s.held += text
	var t, a strings.Builder
	switch s.format {
	case ThinkTags, ThinkChannel, ThinkHarmony:
		// A character cut between two tokens (byte tokens) waits for its
		// last bytes: whether it is whitespace to trim is known only then.
		cut := len(s.held) - incompleteRune(s.held)
		pending := s.held[cut:]
		s.held = s.held[:cut]
		if s.format == ThinkHarmony {
			s.harmony(&t, &a, false)
		} else {
			s.tags(&t, &a, false)
		}
		s.held += pending
	default:
		a.WriteString(s.held)
		s.held = ""
	}
	return t.String(), a.String()
}

// incompleteRune is how many bytes at the end of s begin a multi-byte UTF-8
// character that has not all arrived (0 when none does).
func incompleteRune(s string) int {
	for n := 1; n <= min(len(s), utf8.UTFMax-1); n++ {
		if c := s[len(s)-n]; utf8.RuneStart(c) {
			if c >= utf8.RuneSelf && !utf8.FullRuneInString(s[len(s)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

// Flush returns what is held at the end of the reply.
func (s *Splitter) Flush() (thought, answer string) {
	var t, a strings.Builder
	switch s.format {
	case ThinkTags, ThinkChannel:
		s.tags(&t, &a, true)
	case ThinkHarmony:
		s.harmony(&t, &a, true)
		if s.inCall && json.Valid([]byte(s.callBody.String())) {
			// The engine ends a reply on <|call|> without passing the token on: whole arguments end the call.
			a.WriteString("}")
			s.inCall = false
		}
	default:
		a.WriteString(s.held)
	}
	s.held = ""
	return t.String(), a.String()
}

// emit routes text to the thought or the answer, trimming whitespace where a thought starts or ends and where the
// answer after it starts.
func (s *Splitter) emit(t, a *strings.Builder, text string, thought bool) {
	if s.trimLeft {
		text = strings.TrimLeftFunc(text, unicode.IsSpace)
		if text == "" {
			return
		}
		s.trimLeft = false
	}
	if !thought {
		a.WriteString(text)
		return
	}
	text = s.wsHeld + text
	body := strings.TrimRightFunc(text, unicode.IsSpace)
	s.wsHeld = text[len(body):]
	t.WriteString(body)
}

func (s *Splitter) tags(t, a *strings.Builder, final bool) {
	for s.held != "" {
		switch s.state {
		case before:
			rest := strings.TrimLeftFunc(s.held, unicode.IsSpace)
			switch {
			case strings.HasPrefix(rest, s.open):
				s.held, s.state, s.trimLeft = rest[len(s.open):], in, true
			case !final && strings.HasPrefix(s.open, rest):
				return // maybe the open tag, still arriving
			default:
				s.state = after // the reply opened without a thought
			}
		case in:
			i := strings.Index(s.held, s.close)
			if i >= 0 {
				s.emit(t, a, s.held[:i], true)
				s.held, s.state, s.trimLeft, s.wsHeld = s.held[i+len(s.close):], after, true, ""
				continue
			}
			keep := 0
			if !final {
				keep = partialSuffix(s.held, s.close)
			}
			s.emit(t, a, s.held[:len(s.held)-keep], true)
			s.held = s.held[len(s.held)-keep:]
			if final {
				s.held = ""
			}
			return
		case after:
			s.emit(t, a, s.held, false)
			s.held = ""
		}
	}
}

func (s *Splitter) harmony(t, a *strings.Builder, final bool) {
	for s.held != "" {
		if !s.inBody {
			i := strings.Index(s.held, harmonyMessage)
			if i < 0 || i > maxHarmonyHeader {
				// Decided on the header's length alone, so that any cutting of the text decides the same.
				if len(s.held) > maxHarmonyHeader+len(harmonyMessage) || final {
					s.inBody, s.thought = true, false // not harmony after all: answer text
					continue
				}
				return
			}
			header := s.held[:i]
			name, toFunc := harmonyRecipient(header)
			s.toFunc = toFunc && !s.calls
			if toFunc && s.calls {
				// The body is the call's arguments: the answer gets the call in harmonyToolSyntax.
				a.WriteString(harmonyCall + `{"name": ` + pyjson.String(name) + `, "arguments": `)
				s.thought, s.inCall = false, true
				s.callBody.Reset()
			} else {
				if j := strings.LastIndex(header, harmonyChannel); j >= 0 {
					header = header[j+len(harmonyChannel):]
				}
				s.thought = strings.HasPrefix(strings.TrimSpace(header), "analysis")
			}
			s.held, s.inBody, s.trimLeft, s.wsHeld = s.held[i+len(harmonyMessage):], true, false, ""
			continue
		}
		end, n := -1, 0
		for _, m := range []string{harmonyEnd, harmonyReturn, harmonyCall, harmonyStart} {
			if i := strings.Index(s.held, m); i >= 0 && (end < 0 || i < end) {
				end, n = i, len(m)
			}
		}
		if end >= 0 {
			s.body(t, a, s.held[:end])
			if s.inCall {
				a.WriteString("}")
			}
			s.held, s.inBody, s.inCall, s.toFunc, s.wsHeld = s.held[end+n:], false, false, false, ""
			continue
		}
		keep := 0
		if !final {
			for _, m := range []string{harmonyEnd, harmonyReturn, harmonyCall, harmonyStart} {
				keep = max(keep, partialSuffix(s.held, m))
			}
		}
		s.body(t, a, s.held[:len(s.held)-keep])
		s.held = s.held[len(s.held)-keep:]
		if final {
			s.held = ""
		}
		return
	}
}

// body routes text of a harmony message's body.
func (s *Splitter) body(t, a *strings.Builder, text string) {
	switch {
	case s.toFunc:
		return
	case s.inCall:
		s.callBody.WriteString(text)
	}
	s.emit(t, a, text, s.thought)
}

// harmonyRecipient returns the function a harmony message header sends its message to: NAME of "to=functions.NAME",
// which gpt-oss writes before the channel (assistant to=functions.NAME<|channel|>commentary json) or after it
// (<|channel|>commentary to=functions.NAME <|constrain|>json).
func harmonyRecipient(header string) (string, bool) {
	const to = "to=functions."
	i := strings.Index(header, to)
	if i < 0 {
		return "", false
	}
	name := header[i+len(to):]
	if j := strings.IndexAny(name, " \t\n<"); j >= 0 {
		name = name[:j]
	}
	return name, name != ""
}

// partialSuffix returns the length of the longest suffix of s that is a proper prefix of marker.
func partialSuffix(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}
