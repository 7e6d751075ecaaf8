package llm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/media"
)

// The test binary is also the current engine's GPU probe child
// (TestGPUProbeChild starts this executable).
func TestMain(m *testing.M) {
	if llm.GPUProbeChild(os.Getenv) {
		os.Exit(llm.ServeGPUProbe(os.Getenv))
	}
	if media.DecoderChild(os.Getenv) { // the vision test decodes its images in this binary's child
		os.Exit(media.ServeDecoder(os.Getenv, os.Stdin, os.Stdout))
	}
	llm.SetNativeLog(os.Stderr, false) // keep test output readable
	goleak.VerifyTestMain(m)
}

func mustOpen(tb testing.TB, cfg llm.Config) *llm.Engine {
	tb.Helper()
	if cfg.Path == "" {
		cfg.Path = testmodel.Path(tb)
	}
	e, err := llm.Open(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	return e
}

func greedy(n int) parley.Params {
	p := parley.DefaultParams()
	p.Temperature = 0
	p.RepeatPenalty = 1
	p.MaxTokens = n
	p.Seed = 1
	return p
}

type result struct {
	ids   []int
	lps   []float64
	text  string
	final parley.Event
}

func collect(t testing.TB, ch <-chan parley.Event) result {
	t.Helper()
	var r result
	for ev := range ch {
		if ev.Done {
			r.final = ev
			continue
		}
		r.ids = append(r.ids, ev.Token.ID)
		r.text += ev.Token.Text
	}
	return r
}

func generate(t testing.TB, e *llm.Engine, key, prompt string, p parley.Params) result {
	t.Helper()
	toks, err := e.Tokenize(prompt)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: key, Tokens: toks, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, ch)
}

func TestInfo(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2})
	info := e.Info()
	if info.Architecture != "llama" || info.VocabSize != 512 || info.ContextLength != 512 || info.Parallel != 2 {
		t.Fatalf("unexpected info %+v", info)
	}
	if info.Parameters < 250_000 || info.Parameters > 350_000 {
		t.Fatalf("parameters = %d, want about 292,800", info.Parameters)
	}
	if !slices.Contains(info.ControlTokens, "</s>") || !slices.Contains(info.ControlTokens, "<s>") {
		t.Fatalf("control tokens %q, want <s> and </s>", info.ControlTokens)
	}
	if info.ChatTemplate != "" {
		t.Fatalf("stories260K has no chat template, got %q", info.ChatTemplate)
	}
}

func TestGreedyReplyIsDeterministicAndCapped(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1})
	a := generate(t, e, "", "Once upon a time", greedy(24))
	b := generate(t, e, "", "Once upon a time", greedy(24))
	if a.final.Finish != parley.FinishLength || len(a.ids) != 24 || a.final.Usage.CompletionTokens != 24 {
		t.Fatalf("want 24 tokens and finish length, got %d tokens, %+v", len(a.ids), a.final)
	}
	if a.text != b.text || strings.TrimSpace(a.text) == "" {
		t.Fatalf("greedy replies differ or are empty: %q vs %q", a.text, b.text)
	}
	if a.final.Timings.TimeToFirstToken <= 0 || a.final.Timings.Total < a.final.Timings.TimeToFirstToken {
		t.Fatalf("bad timings %+v", a.final.Timings)
	}
}

func TestKVReuseAcrossTurns(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2})
	first := generate(t, e, "s1", "Once upon a time, there was a little girl", greedy(16))
	if first.final.Usage.CachedPromptTokens != 0 {
		t.Fatalf("first turn reused %d tokens from an empty cache", first.final.Usage.CachedPromptTokens)
	}
	prompt2 := "Once upon a time, there was a little girl" + first.text + " She said hello."
	second := generate(t, e, "s1", prompt2, greedy(16))
	toks, _ := e.Tokenize("Once upon a time, there was a little girl")
	if got := second.final.Usage.CachedPromptTokens; got < len(toks)-1 {
		t.Fatalf("second turn reused %d tokens, want at least %d", got, len(toks)-1)
	}
	// The same prompt in a fresh engine gives the same reply: reuse changes nothing.
	fresh := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2})
	if want := generate(t, fresh, "other", prompt2, greedy(16)); want.text != second.text {
		t.Fatalf("reply with reused cache %q differs from fresh %q", second.text, want.text)
	}
	st := e.Stats()
	if st.PromptReused == 0 || st.TokensGenerated != 32 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSlotTakeOverKeepsRepliesCorrect(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	a1 := generate(t, e, "a", "Lily went to the park", greedy(12))
	_ = generate(t, e, "b", "Tom had a big red ball", greedy(12)) // takes the only slot
	a2 := generate(t, e, "a", "Lily went to the park", greedy(12))
	if a1.text != a2.text {
		t.Fatalf("reply changed after the slot was taken over: %q vs %q", a1.text, a2.text)
	}
}

func TestConcurrentGreedyRepliesMatchSolo(t *testing.T) {
	prompts := []string{"Once upon a time", "Lily had a cat", "The sun was hot", "Tom and Sue played",
		"A little bird sang", "The dog ran fast", "Mom made a cake", "There was a big tree"}
	solo := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	want := make([]string, len(prompts))
	for i, p := range prompts {
		want[i] = generate(t, solo, "", p, greedy(32)).text
	}
	par := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 8})
	got := make([]string, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = generate(t, par, p, p, greedy(32)).text
		}()
	}
	wg.Wait()
	for i := range prompts {
		if got[i] != want[i] {
			t.Errorf("prompt %q: beside 7 others %q, alone %q", prompts[i], got[i], want[i])
		}
	}
}

func TestCancelFreesSlotWithinAStep(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 2048, Parallel: 1, QueueSize: 1})
	toks, _ := e.Tokenize("Once upon a time")
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: greedy(1500)})
	if err != nil {
		t.Fatal(err)
	}
	<-ch // first token: it is generating
	cancel()
	r := collect(t, ch)
	if r.final.Finish != parley.FinishCancelled {
		t.Fatalf("finish = %q, want cancelled", r.final.Finish)
	}
	if r.final.Usage.CompletionTokens > 100 {
		t.Fatalf("%d tokens generated after cancel", r.final.Usage.CompletionTokens)
	}
	// The slot is free for the next request: it runs to its length, and no
	// token of the cancelled one was sampled behind it (counted, not timed:
	// a busy machine may queue it a while).
	before := e.Stats().TokensGenerated
	next := generate(t, e, "", "Lily", greedy(4))
	if next.final.Finish != parley.FinishLength {
		t.Fatalf("next request after cancel: %+v", next.final)
	}
	if n := e.Stats().TokensGenerated - before; n != int64(next.final.Usage.CompletionTokens) {
		t.Fatalf("%d tokens sampled while the next request made %d: the cancelled one went on", n, next.final.Usage.CompletionTokens)
	}
}

func TestBusyWhenQueueFull(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 2048, Parallel: 1, QueueSize: -1})
	toks, _ := e.Tokenize("Once upon a time")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: greedy(1500)})
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	// One slot, no queue: the slot's channel slot in the queue buffer is taken
	// by nobody now, so fill it, then the next must be refused.
	var refused error
	var extra []<-chan parley.Event
	for range 3 {
		c, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: greedy(2)})
		if err != nil {
			refused = err
			break
		}
		extra = append(extra, c)
	}
	if parley.ErrorCode(refused) != parley.EBusy {
		t.Fatalf("want EBusy, got %v", refused)
	}
	cancel()
	collect(t, ch)
	for _, c := range extra {
		collect(t, c)
	}
}

func TestBadRequests(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 128, Parallel: 1})
	long := make([]int, 200)
	bad := greedy(4)
	bad.Temperature = -1
	cases := []struct {
		name string
		req  parley.GenerateRequest
		code string
	}{
		{"empty", parley.GenerateRequest{Params: greedy(4)}, parley.EInvalid},
		{"too long", parley.GenerateRequest{Tokens: long, Params: greedy(4)}, parley.ETooLarge},
		{"bad token", parley.GenerateRequest{Tokens: []int{1, 99999}, Params: greedy(4)}, parley.EInvalid},
		{"negative token", parley.GenerateRequest{Tokens: []int{-5}, Params: greedy(4)}, parley.EInvalid},
		{"bad params", parley.GenerateRequest{Tokens: []int{1}, Params: bad}, parley.EInvalid},
		{"bad grammar", parley.GenerateRequest{Tokens: []int{1}, Params: withGrammar(`root ::= (`)}, parley.EInvalid},
		{"llguidance", parley.GenerateRequest{Tokens: []int{1}, Params: withGrammar("%llguidance {}\nstart: \"a\"")}, parley.EInvalid},
		{"left recursion", parley.GenerateRequest{Tokens: []int{1}, Params: withGrammar(`root ::= root "a"`)}, parley.EInvalid},
		{"undefined rule", parley.GenerateRequest{Tokens: []int{1}, Params: withGrammar(`root ::= foo`)}, parley.EInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Generate(context.Background(), c.req)
			if parley.ErrorCode(err) != c.code {
				t.Fatalf("want %s, got %v", c.code, err)
			}
		})
	}
	// Still works.
	if r := generate(t, e, "", "Lily", greedy(4)); len(r.ids) != 4 {
		t.Fatalf("engine broken after bad requests: %+v", r)
	}
}

func withGrammar(g string) parley.Params {
	p := greedy(8)
	p.Grammar = g
	return p
}

func TestGrammarConstrainsOutput(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	p := withGrammar(`root ::= "yes" | "no"`)
	r := generate(t, e, "", "Once upon a time", p)
	if r.text != "yes" && r.text != "no" {
		t.Fatalf("grammar output %q", r.text)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "x.gguf")
	os.WriteFile(notGGUF, []byte("hello world"), 0o600)
	truncated := filepath.Join(dir, "t.gguf")
	src, _ := os.ReadFile(testmodel.Path(t))
	os.WriteFile(truncated, src[:200], 0o600)
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.gguf"), "not found"},
		{notGGUF, "not a GGUF"},
		{dir, "directory"},
		{truncated, "damaged"},
	} {
		_, err := llm.Open(llm.Config{Path: c.path})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want error containing %q, got %v", c.path, c.want, err)
		}
	}
}

func TestClosedEngineRefuses(t *testing.T) {
	e, err := llm.Open(llm.Config{Path: testmodel.Path(t), ContextLength: 128, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	_, err = e.Generate(context.Background(), parley.GenerateRequest{Tokens: []int{1}, Params: greedy(2)})
	if parley.ErrorCode(err) != parley.EUnavailable {
		t.Fatalf("want EUnavailable after close, got %v", err)
	}
	if !errors.Is(err, err) {
		t.Fatal("unreachable")
	}
}

// A new session whose prompt starts like what a free slot holds (here: the
// same long system prompt) is given that slot, and the shared prefix is
// not evaluated again.
func TestNewSessionReusesASharedPrefix(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 3})
	system := "System: You are a kind storyteller who tells short, happy stories about animals in the forest.\n\n"
	generate(t, e, "a", system+"User: Tell me about a fox", greedy(4))
	generate(t, e, "b", "User: something else entirely, with nothing in common", greedy(4))
	r := generate(t, e, "c", system+"User: Tell me about a bear", greedy(4))
	shared, _ := e.Tokenize(system + "User: Tell me about a")
	if got := r.final.Usage.CachedPromptTokens; got < len(shared)-2 {
		t.Fatalf("new session reused %d tokens, want about %d (the shared system prompt)", got, len(shared))
	}
}

// TestKVCacheTypeRefusals: KV cache types llama.cpp cannot use here are
// refused by Open with a clear error before llama.cpp sees them (an
// unknown name would silently be f16; a quantized V cache without flash
// attention fails; stories260K's 8-value heads are not a whole 32-value
// quantized block, which would trip a ggml assertion and abort).
func TestKVCacheTypeRefusals(t *testing.T) {
	for _, tc := range []struct{ typ, fa, want string }{
		{"q5_1", "on", "want f16, q8_0 or q4_0"},
		{"Q8_0", "on", "want f16, q8_0 or q4_0"},
		{"q8_0", "off", "needs flash attention on"},
		{"q4_0", "auto", "needs flash attention on"},
		{"q8_0", "on", "multiples of 32"},
	} {
		_, err := llm.Open(llm.Config{Path: testmodel.Path(t), ContextLength: 128, Parallel: 1,
			FlashAttention: tc.fa, KVCacheType: tc.typ})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kv cache %s, flash attention %s: error %v, want one containing %q", tc.typ, tc.fa, err, tc.want)
		}
	}
	e, err := llm.Open(llm.Config{Path: testmodel.Path(t), ContextLength: 128, Parallel: 1, KVCacheType: "f16"})
	if err != nil {
		t.Fatalf("f16 (the default, spelled out): %v", err)
	}
	e.Close()
}
