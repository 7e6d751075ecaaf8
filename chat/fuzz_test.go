package chat_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// FuzzStreamer: for any reply bytes, any way of cutting them into pieces and
// any two stop strings, every emit is valid UTF-8, the emits add up to the
// reference text (invalid bytes replaced, cut before the first stop), and no
// stop string is ever emitted.
func FuzzStreamer(f *testing.F) {
	seeds := []struct {
		raw          string
		cuts         string
		stop1, stop2 string
	}{
		{"Once upon a time.\nUser: hi", "\x03\x01\x05", "\nUser:", ""},
		{"caf\xc3\xa9 \xf0\x9f\x8c\x8d done", "\x04\x01\x02\x01", "", ""},
		{"bad \xff\xfe \xe2\x82 end", "\x01\x01\x01", "\uFFFD", "end"},
		{"x<|im_end|>y</s>", "\x02\x05", "</s>", "<|im_end|>"},
		{"abcd", "\x01", "abcd", "bc"},
		{"日本語テキスト", "\x01\x02", "本語", "\xe8"},
		{"", "", "", ""},
	}
	for _, s := range seeds {
		f.Add([]byte(s.raw), []byte(s.cuts), s.stop1, s.stop2)
	}
	f.Fuzz(func(t *testing.T, raw, cuts []byte, stop1, stop2 string) {
		stops := []string{stop1, stop2}
		var pieces []string
		rest := string(raw)
		for i := 0; rest != ""; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i]%8))
			}
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		got, stopped := runStreamer(t, stops, pieces)
		want, wantStopped := streamReference(string(raw), stops)
		if got != want || stopped != wantStopped {
			t.Fatalf("pieces %q stops %q:\n got %q (stopped %v)\nwant %q (stopped %v)", pieces, stops, got, stopped, want, wantStopped)
		}
		for _, s := range stops {
			// A stop string matches the text as emitted: its invalid bytes
			// count as U+FFFD, one each.
			var clean strings.Builder
			for _, r := range s {
				clean.WriteRune(r)
			}
			if s != "" && strings.Contains(got, clean.String()) {
				t.Fatalf("stop %q emitted in %q", s, got)
			}
		}
	})
}

// FuzzRender: for any family and any conversation, Render does not panic,
// keeps valid input valid, and the prompt of a turn followed by the reply
// is where the next turn's prompt starts (the KV-cache reuse invariant).
func FuzzRender(f *testing.F) {
	f.Add(uint8(0), uint8(0b0110), "You are terse.", "Hi", "Hello!", "Bye?", true)
	f.Add(uint8(3), uint8(0), "", "  spaced  ", "\n", "\x1c", false)
	f.Add(uint8(5), uint8(0b1111), "<|im_end|>", "[INST]", "</s>", "<<SYS>>", true)
	f.Add(uint8(8), uint8(0b0001), "日本語", "🌍", "\xff", "User:", true)
	names := chat.TemplateNames()
	roles := []parley.Role{parley.RoleSystem, parley.RoleUser, parley.RoleAssistant}
	f.Fuzz(func(t *testing.T, family, roleBits uint8, a, b, c, d string, gen bool) {
		tmpl, err := chat.TemplateByName(names[int(family)%len(names)])
		if err != nil {
			t.Fatal(err)
		}
		var msgs []parley.Message
		for i, content := range []string{a, b, c, d} {
			msgs = append(msgs, parley.Message{Role: roles[int(roleBits>>(2*i))%3], Content: content})
		}
		out, err := tmpl.Render(msgs, chat.RenderOptions{AddGenerationPrompt: gen})
		if err != nil {
			t.Fatalf("%s: %v", tmpl.Name(), err)
		}
		allValid := utf8.ValidString(a) && utf8.ValidString(b) && utf8.ValidString(c) && utf8.ValidString(d)
		if allValid && !utf8.ValidString(out) {
			t.Fatalf("%s: valid input rendered as invalid UTF-8 %q", tmpl.Name(), out)
		}
		if msgs[len(msgs)-1].Role != parley.RoleUser {
			return
		}
		this, _ := tmpl.Render(msgs, chat.Gen)
		next, _ := tmpl.Render(append(msgs, parley.Message{Role: parley.RoleAssistant, Content: c}, parley.Message{Role: parley.RoleUser, Content: d}), chat.Gen)
		if !strings.HasPrefix(next, this) {
			t.Fatalf("%s: next prompt does not extend this one:\nthis %q\nnext %q", tmpl.Name(), this, next)
		}
	})
}
