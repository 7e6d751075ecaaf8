package chat_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/parley-chat/parley/chat"
)

func TestStreamer(t *testing.T) {
	tests := []struct {
		name        string
		stops       []string
		pieces      []string
		want        []string // what each Push emits
		wantFlush   string
		wantStopped bool
	}{
		{"ascii passes through", nil, []string{"Hello", " world"}, []string{"Hello", " world"}, "", false},
		{"2-byte char split", nil, []string{"caf\xc3", "\xa9!"}, []string{"caf", "é!"}, "", false},
		{"3-byte char over three pieces", nil, []string{"\xe2", "\x82", "\xac"}, []string{"", "", "€"}, "", false},
		{"emoji split", nil, []string{"\xf0\x9f", "\x8c", "\x8dx"}, []string{"", "", "🌍x"}, "", false},
		{"two emoji in one piece split oddly", nil, []string{"\xf0\x9f\x8c\x8d\xf0", "\x9f\x8c\x8d"}, []string{"🌍", "🌍"}, "", false},
		{"invalid byte replaced at once", nil, []string{"a\xffb"}, []string{"a\uFFFDb"}, "", false},
		{"lone continuation byte", nil, []string{"\x80z"}, []string{"\uFFFDz"}, "", false},
		{"lead byte then ASCII", nil, []string{"\xe2", "A"}, []string{"", "\uFFFDA"}, "", false},
		{"surrogate encoding is invalid", nil, []string{"\xed\xa0\x80"}, []string{"\uFFFD\uFFFD\uFFFD"}, "", false},
		{"incomplete at the end is flushed replaced", nil, []string{"ok\xe2\x82"}, []string{"ok"}, "\uFFFD\uFFFD", false},
		{"stop inside a piece", []string{"STOP"}, []string{"abcSTOPdef"}, []string{"abc"}, "", true},
		{"stop across pieces", []string{"STOP"}, []string{"ab", "cS", "TO", "Pxyz"}, []string{"ab", "c", "", ""}, "", true},
		{"nothing after a stop", []string{"STOP"}, []string{"aSTOP", "more"}, []string{"a", ""}, "", true},
		{"stop prefix that is not a stop", []string{"\nUser:"}, []string{"Hi\n", "Use", "ful"}, []string{"Hi", "", "\nUseful"}, "", false},
		{"stop prefix at the end is flushed", []string{"\nUser:"}, []string{"end\n"}, []string{"end"}, "\n", false},
		{"plain template stop", []string{"\nUser:", "\nSystem:"}, []string{" The", " end", ".\n", "User", ":", " hi"}, []string{" The", " end", ".", "", "", ""}, "", true},
		{"first of several stops", []string{"</s>", "<|im_end|>"}, []string{"x<|im_e", "nd|>y</s>"}, []string{"x", ""}, "", true},
		{"the stop that completes first wins", []string{"abcd", "bc"}, []string{"a", "b", "c", "d"}, []string{"", "", "a", ""}, "", true},
		{"same in one piece", []string{"abcd", "bc"}, []string{"abcd"}, []string{"a"}, "", true},
		{"of stops completing together the longer wins", []string{"bc", "abc"}, []string{"xabc"}, []string{"x"}, "", true},
		{"multibyte stop over split char", []string{"ñ!"}, []string{"a\xc3", "\xb1", "!"}, []string{"a", "", ""}, "", true},
		{"multibyte prefix released", []string{"ñ!"}, []string{"ñ", "o"}, []string{"", "ño"}, "", false},
		{"empty stop ignored", []string{""}, []string{"abc"}, []string{"abc"}, "", false},
		{"replacement char stop matches invalid byte", []string{"\uFFFD"}, []string{"ok\xff"}, []string{"ok"}, "", true},
		{"invalid byte in stop string", []string{"\xfe"}, []string{"a\xffb"}, []string{"a"}, "", true},
		{"stop completed by flush", []string{"\uFFFD"}, []string{"ok\xe2"}, []string{"ok"}, "", true},
		{"held prefix and partial char together", []string{"<end>"}, []string{"a<e", "\xc3"}, []string{"a", ""}, "<e\uFFFD", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := chat.NewStreamer(tt.stops)
			var got []string
			stopped := false
			for _, p := range tt.pieces {
				var emit string
				emit, stopped = s.Push(p)
				if !utf8.ValidString(emit) {
					t.Errorf("Push(%q) emitted invalid UTF-8 %q", p, emit)
				}
				got = append(got, emit)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("emits %q, want %q", got, tt.want)
			}
			flush := s.Flush()
			if flush != tt.wantFlush {
				t.Errorf("Flush() = %q, want %q", flush, tt.wantFlush)
			}
			if s.Stopped() != tt.wantStopped || (stopped && !tt.wantStopped) {
				t.Errorf("stopped = %v (last Push %v), want %v", s.Stopped(), stopped, tt.wantStopped)
			}
			if again := s.Flush(); again != "" {
				t.Errorf("second Flush() = %q, want \"\"", again)
			}
			if emit, _ := s.Push("late"); emit != "" {
				t.Errorf("Push after Flush emitted %q", emit)
			}
		})
	}
}

// streamReference computes, without streaming, what a Streamer must emit in
// total for raw: the text with each invalid byte replaced by U+FFFD, cut
// before the stop occurrence that ends first (the longest of those ending
// together).
func streamReference(raw string, stops []string) (string, bool) {
	var b strings.Builder
	for _, r := range raw { // invalid bytes decode as U+FFFD, one per byte
		b.WriteRune(r)
	}
	text := b.String()
	var clean []string
	for _, s := range stops {
		if s == "" {
			continue
		}
		var sb strings.Builder
		for _, r := range s {
			sb.WriteRune(r)
		}
		clean = append(clean, sb.String())
	}
	for end := 1; end <= len(text); end++ {
		best := -1
		for _, s := range clean {
			if strings.HasSuffix(text[:end], s) && (best < 0 || end-len(s) < best) {
				best = end - len(s)
			}
		}
		if best >= 0 {
			return text[:best], true
		}
	}
	return text, false
}

// runStreamer pushes pieces and flushes, checking every emit is valid UTF-8.
func runStreamer(t testing.TB, stops, pieces []string) (string, bool) {
	t.Helper()
	s := chat.NewStreamer(stops)
	var out strings.Builder
	for _, p := range pieces {
		emit, _ := s.Push(p)
		if !utf8.ValidString(emit) {
			t.Fatalf("Push(%q) emitted invalid UTF-8 %q", p, emit)
		}
		out.WriteString(emit)
	}
	tail := s.Flush()
	if !utf8.ValidString(tail) {
		t.Fatalf("Flush emitted invalid UTF-8 %q", tail)
	}
	out.WriteString(tail)
	return out.String(), s.Stopped()
}

// TestStreamerSplitInvariant: however a reply is cut into pieces, the
// Streamer emits the same text as the reference.
func TestStreamerSplitInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	texts := []string{
		"Once upon a time, there was a little dog.\nUser: hi",
		"naïve café — 日本語のテキスト 🌍🚀 done</s> trailing",
		"broken \xff\xfe bytes \xe2\x82 and \xf0\x9f\x8c then <|im_end|>",
		"ababcabcdabcde\n\nUser\nUser:",
		"\uFFFD real replacement char",
	}
	stopSets := [][]string{
		nil,
		{"\nUser:"},
		{"</s>", "<|im_end|>"},
		{"abcd", "bc", "cab"},
		{"日本", "🚀"},
		{"\uFFFD"},
		{"e"},
	}
	for _, text := range texts {
		for _, stops := range stopSets {
			want, wantStopped := streamReference(text, stops)
			for trial := 0; trial < 50; trial++ {
				var pieces []string
				for rest := text; rest != ""; {
					n := min(len(rest), rng.IntN(6))
					pieces = append(pieces, rest[:n])
					rest = rest[n:]
				}
				got, stopped := runStreamer(t, stops, pieces)
				if got != want || stopped != wantStopped {
					t.Fatalf("text %q stops %q pieces %q:\n got %q (stopped %v)\nwant %q (stopped %v)", text, stops, pieces, got, stopped, want, wantStopped)
				}
			}
		}
	}
}
