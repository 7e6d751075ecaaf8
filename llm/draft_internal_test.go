package llm

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
)

func TestNgramLookup(t *testing.T) {
	x := newNgramIndex(64)
	// "a b c d e" ... then "b c" again: the draft is what followed "b c".
	x.reset([]int{1, 2, 3, 4, 5, 9, 2, 3})
	if got := x.lookup(nil, 3); !slices.Equal(got, []int{4, 5, 9}) {
		t.Errorf("draft %v, want [4 5 9]", got)
	}
	if got := x.lookup(nil, 10); !slices.Equal(got, []int{4, 5, 9, 2, 3}) {
		t.Errorf("draft %v, want the rest of the history", got)
	}
	// The longest match wins over a later, shorter one: "7 2 3" occurs
	// once, followed by 8; "2 3" last occurred followed by 6.
	x.reset([]int{7, 2, 3, 8, 0, 2, 3, 6, 1, 7, 2, 3})
	if got := x.lookup(nil, 1); !slices.Equal(got, []int{8}) {
		t.Errorf("draft %v, want [8] (the 3-gram's)", got)
	}
	// The latest occurrence of an n-gram wins.
	x.reset([]int{5, 6, 1, 5, 6, 2, 5, 6})
	if got := x.lookup(nil, 1); !slices.Equal(got, []int{2}) {
		t.Errorf("draft %v, want [2]", got)
	}
	// A new history sharing only a prefix: the old tokens are never drafted.
	x.reset([]int{5, 6, 1, 0, 0, 4, 5, 6})
	if got := x.lookup(nil, 4); !slices.Equal(got, []int{1, 0, 0, 4}) {
		t.Errorf("draft %v after reset, want [1 0 0 4]", got)
	}
	x.truncate(3)
	x.push(9)
	x.push(5)
	x.push(6)
	if got := x.lookup(nil, 2); !slices.Equal(got, []int{1, 9}) {
		t.Errorf("draft %v after truncate and push, want [1 9]", got)
	}
	// An image's positions (negative pseudo ids) end a draft: "4 5" last
	// came before "6" and an image; an image right after the match drafts
	// nothing.
	x.reset([]int{4, 5, 6, -7, -8, 1, 4, 5})
	if got := x.lookup(nil, 4); !slices.Equal(got, []int{6}) {
		t.Errorf("draft %v, want [6] (up to the image)", got)
	}
	x.reset([]int{4, 5, -7, -8, 1, 4, 5})
	if got := x.lookup(nil, 4); len(got) != 0 {
		t.Errorf("draft %v, want none (an image follows the match)", got)
	}
	// No match, a history too short, no room.
	x.reset([]int{1, 2, 3, 4})
	if got := x.lookup(nil, 4); len(got) != 0 {
		t.Errorf("draft %v, want none", got)
	}
	x.reset([]int{1})
	if got := x.lookup(nil, 4); len(got) != 0 {
		t.Errorf("draft %v, want none", got)
	}
}

// TestNgramTableBounded: the table never grows past maxDraftTable,
// whatever the history's length, and a history past it still drafts.
func TestNgramTableBounded(t *testing.T) {
	x := newNgramIndex(1 << 20)
	toks := make([]int, 0, 300000)
	for i := range 300000 {
		toks = append(toks, i%50000)
	}
	x.reset(toks)
	x.lookup(nil, 4)
	if len(x.table) > maxDraftTable {
		t.Fatalf("table of %d entries, want at most %d", len(x.table), maxDraftTable)
	}
	if got := x.lookup(nil, 3); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("draft %v, want [0 1 2]", got)
	}
}

func TestDraftStateBacksOff(t *testing.T) {
	var d draftState
	if c := d.chance(); c != 0.5 {
		t.Fatalf("prior chance %v, want 0.5", c)
	}
	for range 10 {
		d.record(8, 8)
	}
	high := d.chance()
	for range 10 {
		d.record(4, 0)
	}
	low := d.chance()
	if !(high > 0.8 && low < 0.2) {
		t.Fatalf("chance %v after drafts that held, %v after drafts that missed", high, low)
	}
	for range 200 {
		d.record(0, 0)
	}
	if c := d.chance(); c < 0.4 {
		t.Fatalf("chance %v after many steps without drafts: it should come back toward the prior", c)
	}
	if d.drafted != 120 || d.accepted != 80 {
		t.Fatalf("counted %d drafted, %d held", d.drafted, d.accepted)
	}
}

// TestDraftCostFit: steps whose time is 10 ms + 1 ms a token give that fit,
// and the bar follows: one stream drafts at a low chance, eight at a high one.
func TestDraftCostFit(t *testing.T) {
	var c draftCost
	if b := c.bar(1, 1); b <= 0 || b >= 0.5 {
		t.Fatalf("prior bar %v for one stream", b)
	}
	for i := range 200 {
		n := 1 + i%9
		c.observe(n, time.Duration(10+n)*time.Millisecond)
	}
	if d := c.fixed - 0.010; d > 1e-6 || d < -1e-6 {
		t.Fatalf("fixed %v, want 10ms", c.fixed)
	}
	if d := c.perToken - 0.001; d > 1e-6 || d < -1e-6 {
		t.Fatalf("per token %v, want 1ms", c.perToken)
	}
	if b := c.bar(1, 2); b > 0.1 {
		t.Errorf("bar %v for one stream, want under 0.1", b)
	}
	if b := c.bar(8, 16); b < 0.25 {
		t.Errorf("bar %v for eight streams, want over 0.25", b)
	}
	// Steps of one size only: the prior decides.
	var p draftCost
	for range 50 {
		p.observe(1, 12*time.Millisecond)
	}
	if p.fixed <= 0 || p.perToken <= 0 {
		t.Fatalf("no fit from steps of one size: %v %v", p.fixed, p.perToken)
	}
}

// TestDraftCancelledMidDraft: a request cancelled after a step decoded its
// draft and before the draft was verified (inline, and with a grammar whose
// sampler verifies it off the loop; drafts from the conversation and from a
// draft model) leaves its slot clean: the same key's
// next request, which continues the cancelled reply, reuses the cached
// tokens and gets what an engine without drafts gives.
func TestDraftCancelledMidDraft(t *testing.T) {
	prompt := "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom"
	grammar := `root ::= [ a-zA-Z.,]+`
	for _, engine := range []string{EngineEmbedded, EngineCurrent} {
		for _, c := range []struct{ g, dm string }{{"", ""}, {grammar, ""}, {"", testmodel.Path(t)}, {grammar, testmodel.Path(t)}} {
			g := c.g
			t.Run(fmt.Sprintf("%s/grammar=%v/draft-model=%v", engine, g != "", c.dm != ""), func(t *testing.T) {
				cfg := Config{Path: testmodel.Path(t), Threads: 1, Parallel: 1, ContextLength: 512, Engine: engine, LibDir: testLibDir()}
				ref := cfg
				cfg.Draft, ref.Draft = DraftNgram, DraftOff
				cfg.DraftModel = c.dm // the target itself: its drafts hold
				e, err := Open(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				var cancel context.CancelFunc
				e.onDrafted = func(ctx context.Context) {
					if ctx.Value(cancelKey{}) != nil {
						cancel()
					}
				}
				toks, err := e.Tokenize(prompt)
				if err != nil {
					t.Fatal(err)
				}
				p := greedyParams(200)
				p.Grammar = g
				if err := p.Validate(0); err != nil {
					t.Fatal(err)
				}
				ctx, c := context.WithCancel(context.WithValue(context.Background(), cancelKey{}, true))
				cancel = c
				defer c()
				var got []int
				var final parley.Event
				ch, err := e.Generate(ctx, parley.GenerateRequest{Key: "k", Tokens: toks, Params: p})
				if err != nil {
					t.Fatal(err)
				}
				for ev := range ch {
					if ev.Done {
						final = ev
						continue
					}
					got = append(got, ev.Token.ID)
				}
				if final.Finish != parley.FinishCancelled {
					t.Fatalf("finish %s (%v), want cancelled", final.Finish, final.Err)
				}
				if e.Stats().DraftTokens == 0 {
					t.Fatal("no draft was made")
				}
				// The next turn continues the reply as far as it went.
				next := append(slices.Clone(toks), got...)
				more := runOnce(t, e, next, p)
				r, err := Open(ref)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				want := runOnce(t, r, next, p)
				if !slices.Equal(more.ids, want.ids) {
					t.Fatalf("after the cancel: %v\nwithout drafts: %v", more.ids, want.ids)
				}
				if more.final.Usage.CachedPromptTokens < len(toks) {
					t.Errorf("the next turn reused %d cached tokens, want at least the prompt's %d", more.final.Usage.CachedPromptTokens, len(toks))
				}
			})
		}
	}
}

type cancelKey struct{}

type onceResult struct {
	ids   []int
	final parley.Event
}

func runOnce(t *testing.T, e *Engine, toks []int, p parley.Params) onceResult {
	t.Helper()
	ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: "k", Tokens: toks, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	var r onceResult
	for ev := range ch {
		if ev.Done {
			r.final = ev
			continue
		}
		r.ids = append(r.ids, ev.Token.ID)
	}
	if r.final.Err != nil {
		t.Fatal(r.final.Err)
	}
	return r
}

func greedyParams(n int) parley.Params {
	p := parley.DefaultParams()
	p.Temperature, p.RepeatPenalty, p.MaxTokens, p.Seed = 0, 1, n, 1
	return p
}
