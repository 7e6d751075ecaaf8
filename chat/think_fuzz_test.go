package chat_test

import (
	"strings"
	"testing"

	"github.com/parley-chat/parley/chat"
)

// FuzzSplitter: for any reply, prompt tail and way of cutting the reply into pieces, the thought and the answer a
// splitter returns are the same as for the reply in one piece, and neither ever holds a whole marker that the
// splitter consumed (the thought never holds </think>; the answer never holds a harmony marker).
func FuzzSplitter(f *testing.F) {
	seeds := []struct {
		reply, prompt, cuts string
		harmony             bool
	}{
		{"<think>\nhmm\n</think>\n\nHi", "", "\x03\x01\x05", false},
		{"x</think>y", "<think>", "\x01", false},
		{"  <thi", "", "\x02", false},
		{"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b<|return|>", "", "\x04\x07", true},
		{"<|channel|>final<|message|>b<|end", "", "\x03", true},
		{"<|channel|>commentary<|message|>c<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>", "", "\x05\x02", true},
	}
	for _, s := range seeds {
		f.Add(s.reply, s.prompt, []byte(s.cuts), s.harmony)
	}
	f.Fuzz(func(t *testing.T, reply, prompt string, cuts []byte, harmony bool) {
		format := chat.ThinkTags
		if harmony {
			format = chat.ThinkHarmony
		}
		whole := chat.NewSplitter(format, prompt)
		t1, a1 := whole.Push(reply)
		t2, a2 := whole.Flush()
		wantT, wantA := t1+t2, a1+a2

		s := chat.NewSplitter(format, prompt)
		var th, an strings.Builder
		rest := reply
		for i := 0; rest != ""; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i]%9)+1)
			}
			x, y := s.Push(rest[:n])
			th.WriteString(x)
			an.WriteString(y)
			rest = rest[n:]
		}
		x, y := s.Flush()
		th.WriteString(x)
		an.WriteString(y)
		if th.String() != wantT || an.String() != wantA {
			t.Fatalf("cut %q: thought %q answer %q; in one piece %q %q", cuts, th.String(), an.String(), wantT, wantA)
		}
		if !harmony && strings.Contains(wantT, "</think>") {
			t.Fatalf("the thought %q holds the end tag", wantT)
		}
	})
}
