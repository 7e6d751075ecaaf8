package llm_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// chatML renders n messages the way a ChatML template does, with contents
// that put special-token text and whitespace at every kind of place.
func chatML(n int) string {
	contents := []string{"", "hi", " leading space", "<tool_call>x</tool_call>", "two  spaces\n\n", "<|im_end|>typed", "tail<tool_call>"}
	var b strings.Builder
	for i := range n {
		role := []string{"user", "assistant"}[i%2]
		fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", role, contents[i%len(contents)])
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

// TestTokenizeChunked: a prompt with thousands of role markers tokenizes, in
// chunks, to exactly the tokens of one llama.cpp call, with and without
// BOS, on both engines, on a vocabulary with control and user-defined
// tokens and on stories260K's (SentencePiece: a space prefix after every
// special token).
func TestTokenizeChunked(t *testing.T) {
	cfg := llm.Config{ContextLength: 512, Parallel: 1, Threads: 1}
	scripted := engines(t, testmodel.Scripted(t, hermesScript()), cfg)
	stories := engines(t, testmodel.Path(t), cfg)
	for name := range scripted {
		for _, c := range []struct {
			name string
			e    *llm.Engine
			text string
		}{
			{"chatml", scripted[name], chatML(1500)},
			{"chatml short", scripted[name], chatML(3)},
			{"stories", stories[name], strings.Repeat("<s>Once upon a time</s> x</s>\n<s> <unk>y", 400)},
			{"no specials", stories[name], strings.Repeat("Once upon a time ", 3000)},
		} {
			for _, add := range []bool{true, false} {
				whole, err := c.e.TokenizeWhole(c.text, add)
				if err != nil {
					t.Fatal(err)
				}
				got, err := c.e.TokenizeChunks(c.text, add)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, whole) {
					i := 0
					for i < min(len(got), len(whole)) && got[i] == whole[i] {
						i++
					}
					t.Errorf("%s, %s (add %v): %d tokens in chunks, %d in one call, first difference at %d", name, c.name, add, len(got), len(whole), i)
				}
			}
		}
	}
}

// TestTokenizeLimit: TokenizeLimit stops once the text is over the limit
// (having read a bounded part of it), and at once when ctx has ended.
func TestTokenizeLimit(t *testing.T) {
	e := mustOpen(t, llm.Config{Path: testmodel.Scripted(t, hermesScript()), ContextLength: 512, Parallel: 1, Threads: 1})
	text := chatML(6000)
	all, err := e.Tokenize(text)
	if err != nil {
		t.Fatal(err)
	}
	part, err := e.TokenizeLimit(context.Background(), text, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(part) <= 1000 || len(part) >= len(all)/4 || !slices.Equal(part, all[:len(part)]) {
		t.Errorf("limit 1000: %d tokens (of %d), want a prefix just over the limit", len(part), len(all))
	}
	// A long text without special tokens: counted in pieces, stopped
	// after the first.
	plain := strings.Repeat("Once upon a time there was a dog. ", 30000) // 1 MB
	part, err = e.TokenizeLimit(context.Background(), plain, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(part) <= 1000 || len(part) > 20000 {
		t.Errorf("1 MB of text, limit 1000: %d tokens, want just over the limit (one piece)", len(part))
	}
	// Under the limit, the count is exact.
	short := plain[:100000]
	whole, _ := e.TokenizeWhole(short, true)
	got, err := e.TokenizeLimit(context.Background(), short, 1000000)
	if err != nil || !slices.Equal(got, whole) {
		t.Errorf("100 kB under the limit: %d tokens (%v), want the %d of one call", len(got), err, len(whole))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.TokenizeLimit(ctx, text, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	start := time.Now()
	if _, err := e.Tokenize(text); err != nil {
		t.Fatal(err)
	}
	chunked := time.Since(start)
	start = time.Now()
	if _, err := e.TokenizeWhole(text, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("6,000 messages (%d bytes, %d tokens): %v in chunks, %v in one call", len(text), len(all), chunked, time.Since(start))
}
