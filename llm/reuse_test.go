package llm_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
)

// TestExactTokenReuse runs a 10-turn conversation with 160-token replies
// through the chat layer and the real engine, and checks that every turn
// after the first evaluates only its new tokens: the cache holds the last
// prompt and the reply exactly as generated (all but the last sampled token,
// which was never decoded), however the reply's text would re-tokenize.
// Turns where the oldest turns were dropped to fit the window start a new
// prefix and are only printed.
func TestExactTokenReuse(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 1024, Parallel: 1, Threads: 1})
	r := chat.NewResponder(e)
	p := parley.DefaultParams()
	p.MaxTokens = 160
	p.Seed = 7
	p.Stop = nil

	var msgs []parley.Message
	var prev parley.Usage
	prevDropped, checked := 0, 0
	t.Logf("context %d tokens per session", e.Info().ContextLength)
	for turn := 1; turn <= 10; turn++ {
		msgs = append(msgs, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("Tell me a story about a cat called Tom number %d.", turn)})
		rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: "s1", Messages: msgs, Params: p})
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		var final parley.Event
		for ev := range rep.Events() {
			if ev.Done {
				final = ev
			}
		}
		if final.Err != nil {
			t.Fatalf("turn %d: %v", turn, final.Err)
		}
		u := final.Usage
		evaluated := u.PromptTokens - u.CachedPromptTokens
		carried := prev.PromptTokens + prev.CompletionTokens // what the last turn left in the cache, plus one sampled token
		newTokens := u.PromptTokens - carried
		note := ""
		switch {
		case turn == 1:
		case rep.Dropped() != prevDropped:
			note = fmt.Sprintf(" (dropped %d old messages: new prefix)", rep.Dropped())
		default:
			checked++
			// newTokens+1: the last sampled token of the previous reply was
			// never decoded, so it is evaluated with the new ones.
			if evaluated > newTokens+1 {
				t.Errorf("turn %d: evaluated %d prompt tokens, want at most %d (the new tokens)", turn, evaluated, newTokens+1)
			}
		}
		t.Logf("turn %2d: prompt tokens %4d / evaluated %4d / cached %4d, reply %3d tokens (%s)%s",
			turn, u.PromptTokens, evaluated, u.CachedPromptTokens, u.CompletionTokens, final.Finish, note)
		msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()})
		prev, prevDropped = u, rep.Dropped()
	}
	if checked < 3 {
		t.Errorf("only %d turns kept their prefix; want at least 3 to check", checked)
	}
}

// BenchmarkTurnHistory measures one turn (fit, tokenize, evaluate the new
// tokens, generate one token) of a conversation whose stored history is
// empty or 1 MiB, far more than the window holds. The work per turn must not
// depend on the history the window no longer shows. "nomemo" is the same
// without the exact-token memo (every turn renders and tokenizes the whole
// history while fitting).
func BenchmarkTurnHistory(b *testing.B) {
	e := mustOpen(b, llm.Config{ContextLength: 1024, Parallel: 1, Threads: 1})
	for _, bc := range []struct {
		name    string
		history int // bytes
		memo    bool
	}{{"empty", 0, true}, {"1MiB", 1 << 20, true}, {"1MiB-nomemo", 1 << 20, false}} {
		b.Run(bc.name, func(b *testing.B) {
			var g chat.Generator = e
			if !bc.memo {
				g = struct{ chat.Generator }{e} // hides TokenizeContinuation
			}
			r := chat.NewResponder(g)
			p := parley.DefaultParams()
			p.MaxTokens = 1
			var msgs []parley.Message
			for size := 0; size < bc.history; {
				u := fmt.Sprintf("Tell me a story about a cat called Tom number %d.", len(msgs))
				a := "Once upon a time there was a little cat called Tom. He liked to play in the garden with his friends every day."
				msgs = append(msgs, parley.Message{Role: parley.RoleUser, Content: u}, parley.Message{Role: parley.RoleAssistant, Content: a})
				size += len(u) + len(a)
			}
			key := "bench-" + bc.name
			var prepare time.Duration // in Reply: fit, render, tokenize
			turn := func(i int) {
				msgs = append(msgs, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("And then what happened on day %d?", i)})
				t0 := time.Now()
				rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: key, Messages: msgs, Params: p})
				prepare += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				for range rep.Events() {
				}
				msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()})
			}
			turn(-1) // the first turn of a session sees its whole history once
			prepare = 0
			b.ResetTimer()
			for i := range b.N {
				turn(i)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/turn")
			b.ReportMetric(float64(prepare.Microseconds())/float64(b.N), "prepare-µs/turn")
		})
	}
}

// A request that says no client reads logprobs gets NaN instead of a softmax
// over the vocabulary per token; the others get real log-probabilities.
func TestSkipLogprobs(t *testing.T) {
	e := mustOpen(t, llm.Config{Parallel: 1, Threads: 1})
	toks, err := e.Tokenize("Once upon a time")
	if err != nil {
		t.Fatal(err)
	}
	for _, skip := range []bool{false, true} {
		p := greedy(4)
		p.SkipLogprobs = skip
		ch, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for ev := range ch {
			if ev.Done {
				continue
			}
			n++
			if got := math.IsNaN(ev.Token.Logprob); got != skip || (!skip && ev.Token.Logprob > 0) {
				t.Fatalf("skip %v: logprob %v", skip, ev.Token.Logprob)
			}
		}
		if n == 0 {
			t.Fatalf("skip %v: no tokens", skip)
		}
	}
}

// A new session whose prompt starts with a long prefix another slot holds (a
// common system prompt) gets that slot's KV cache copied instead of
// evaluating the prefix, even while the other slot is generating, and
// replies exactly as without the copy.
func TestPrefixCopiedFromAnotherSlot(t *testing.T) {
	system := "System: You are a storyteller. You tell short, happy stories about animals who live in a small village by the sea, and every story ends well for everyone in it.\n\n"
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2, Threads: 1})
	tokA, err := e.Tokenize(system + "User: Tell me about a cat.\n\nAssistant:")
	if err != nil {
		t.Fatal(err)
	}
	tokB, err := e.Tokenize(system + "User: Tell me about a dog.\n\nAssistant:")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := e.Generate(ctx, parley.GenerateRequest{Key: "a", Tokens: tokA, Params: greedy(400)})
	if err != nil {
		t.Fatal(err)
	}
	<-a // A is generating: its slot holds the system prompt
	b, err := e.Generate(context.Background(), parley.GenerateRequest{Key: "b", Tokens: tokB, Params: greedy(24)})
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, b)
	cancel()
	for range a {
	}
	st := e.Stats()
	shared := llm.CommonPrefix(tokA, tokB)
	if st.PrefixCopies != 1 || st.PromptCopied < int64(shared-1) || got.final.Usage.CachedPromptTokens < shared-1 {
		t.Fatalf("copies %d, copied %d tokens, cached %d; want 1 copy of the %d shared tokens", st.PrefixCopies, st.PromptCopied, got.final.Usage.CachedPromptTokens, shared)
	}
	t.Logf("prompt %d tokens, %d shared, %d copied from the other slot", len(tokB), shared, st.PromptCopied)

	fresh := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1, Threads: 1})
	ch, err := fresh.Generate(context.Background(), parley.GenerateRequest{Key: "b", Tokens: tokB, Params: greedy(24)})
	if err != nil {
		t.Fatal(err)
	}
	if want := collect(t, ch); want.text != got.text {
		t.Fatalf("reply after the copy %q, evaluated in full %q", got.text, want.text)
	}
}

// On the CPU a copy of another slot's KV cache costs what a few prompt
// tokens do, so a new session that shares a short opening with another
// slot (here a question's first words, under 32 tokens) gets it copied and
// replies exactly as without the copy, while an opening of fewer than 8
// tokens (a BOS and a role marker) is evaluated again.
func TestShortPrefixCopiedOnCPU(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 3, Threads: 1})
	tok := tokenizer(t, e)
	promptA := "User: Once upon a time, there was a little girl named Lily. Tell me her story.\n\nAssistant:"
	promptB := "User: Once upon a time, there was a little girl named Mia. Tell me her story.\n\nAssistant:"
	promptC := "User: Hi!\n\nAssistant:"
	tokA, tokB, tokC := tok(promptA), tok(promptB), tok(promptC)
	shared := llm.CommonPrefix(tokA, tokB)
	if shared < 8 || shared >= 32 {
		t.Fatalf("the two prompts share %d tokens; the test wants 8-31", shared)
	}
	if n := llm.CommonPrefix(tokA, tokC); n >= 8 {
		t.Fatalf("the third prompt shares %d tokens; the test wants under 8", n)
	}
	generate(t, e, "a", promptA, greedy(4))
	got := generate(t, e, "b", promptB, greedy(16))
	st := e.Stats()
	if st.PrefixCopies != 1 || got.final.Usage.CachedPromptTokens != shared {
		t.Fatalf("copies %d, cached %d; want 1 copy of the %d shared tokens", st.PrefixCopies, got.final.Usage.CachedPromptTokens, shared)
	}
	generate(t, e, "c", promptC, greedy(4))
	if st := e.Stats(); st.PrefixCopies != 1 {
		t.Fatalf("copies %d after a prompt sharing only its opening; want still 1", st.PrefixCopies)
	}

	// The copied reply is the reply of a fresh evaluation.
	fresh := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1, Threads: 1})
	want := generate(t, fresh, "b", promptB, greedy(16))
	if got.text != want.text {
		t.Fatalf("reply after the copy %q, fresh %q", got.text, want.text)
	}
}

// A copy moves the source slot's whole KV stream, so with four times the
// tokens per slot of TestShortPrefixCopiedOnCPU it pays on this tiny model
// only from a longer shared opening (about 25 tokens: copyThreshold): the
// same pair of prompts is now evaluated, a pair sharing more is copied.
func TestCopyThresholdGrowsWithSlots(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 2048, Parallel: 4, Threads: 1})
	tok := tokenizer(t, e)
	short := func(name string) string {
		return "User: Once upon a time, there was a little girl named " + name + ". Tell me her story.\n\nAssistant:"
	}
	long := func(end string) string {
		return "User: Once upon a time, there was a little girl named Lily. She lived in a small house near the woods " +
			"with her mom, her dad and a big brown dog. Tell me what happened to " + end + ".\n\nAssistant:"
	}
	if n := llm.CommonPrefix(tok(short("Lily")), tok(short("Mia"))); n < 8 || n >= 25 {
		t.Fatalf("the short prompts share %d tokens; the test wants 8-24", n)
	}
	sharedLong := llm.CommonPrefix(tok(long("her")), tok(long("the dog")))
	if sharedLong < 30 {
		t.Fatalf("the long prompts share %d tokens; the test wants 30 or more", sharedLong)
	}
	generate(t, e, "a", short("Lily"), greedy(4))
	got := generate(t, e, "b", short("Mia"), greedy(4))
	if st := e.Stats(); st.PrefixCopies != 0 || got.final.Usage.CachedPromptTokens != 0 {
		t.Fatalf("copies %d, cached %d; want the short opening evaluated, not copied", st.PrefixCopies, got.final.Usage.CachedPromptTokens)
	}
	generate(t, e, "c", long("her"), greedy(4))
	got = generate(t, e, "d", long("the dog"), greedy(4))
	if st := e.Stats(); st.PrefixCopies != 1 || got.final.Usage.CachedPromptTokens != sharedLong {
		t.Fatalf("copies %d, cached %d; want 1 copy of the %d shared tokens", st.PrefixCopies, got.final.Usage.CachedPromptTokens, sharedLong)
	}
}

// tokenizer returns e's tokenizer for test strings, failing t on an error.
func tokenizer(t *testing.T, e *llm.Engine) func(string) []int {
	return func(s string) []int {
		t.Helper()
		toks, err := e.Tokenize(s)
		if err != nil {
			t.Fatal(err)
		}
		return toks
	}
}
