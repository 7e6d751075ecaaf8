package llm

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
)

// logprob64 is the definition: log softmax(logits / temp)[tok] in float64.
func logprob64(logits []float32, tok int, temp float64) float64 {
	if temp <= 0 {
		temp = 1
	}
	maxL := math.Inf(-1)
	for _, l := range logits {
		maxL = math.Max(maxL, float64(l)/temp)
	}
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l)/temp - maxL)
	}
	return float64(logits[tok])/temp - maxL - math.Log(sum)
}

func TestLogprobMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 7, 8, 9, 31, 32000, 49152, 151936} {
		for _, spread := range []float64{0.01, 3, 12, 40} {
			logits := make([]float32, n)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64()*spread + 2)
			}
			if n > 9 {
				logits[n/3] = float32(math.Inf(-1)) // a banned token
				logits[n-1] = -200                  // far below the rest, in the tail
			}
			for _, temp := range []float64{0, 0.3, 1, 2.5} {
				toks := []int{0, n / 2, n - 1, rng.IntN(n)}
				best := 0
				for i, l := range logits {
					if l > logits[best] {
						best = i
					}
				}
				toks = append(toks, best)
				for _, tok := range toks {
					got, want := logprob(logits, tok, temp), logprob64(logits, tok, temp)
					if math.IsInf(want, -1) {
						if !math.IsInf(got, -1) {
							t.Fatalf("n %d spread %v temp %v tok %d: got %v, want -Inf", n, spread, temp, tok, got)
						}
						continue
					}
					if d := math.Abs(got - want); d > 1e-5+1e-6*math.Abs(want) || got > 0 {
						t.Fatalf("n %d spread %v temp %v tok %d: got %.9g, want %.9g (off by %.3g)", n, spread, temp, tok, got, want, d)
					}
				}
			}
		}
	}
	if lp := logprob([]float32{1, 2}, 2, 1); !math.IsNaN(lp) {
		t.Fatalf("a token past the vocabulary: %v, want NaN", lp)
	}
	if lp := logprob([]float32{1, float32(math.NaN()), 2}, 0, 1); !math.IsNaN(lp) {
		t.Fatalf("NaN logits: %v, want NaN", lp)
	}
}

// BenchmarkLogprob: one token's logprob over a SmolLM2-sized vocabulary,
// the loop's cost per token for a client that reads logprobs.
func BenchmarkLogprob(b *testing.B) {
	logits := make([]float32, 49152)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	b.Run("vector", func(b *testing.B) {
		for b.Loop() {
			logprob(logits, 7, 0)
		}
	})
	b.Run("float64", func(b *testing.B) {
		for b.Loop() {
			logprob64(logits, 7, 0)
		}
	})
}

func TestArgmax(t *testing.T) {
	for _, c := range []struct {
		logits []float32
		want   int
	}{
		{nil, 0},
		{[]float32{1}, 0},
		{[]float32{1, 3, 3, 2}, 1}, // the first of equals
		{[]float32{0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 5}, 9},     // in the scalar tail
		{[]float32{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9}, 11}, // after a full vector
		{[]float32{-3, float32(math.NaN()), -1, float32(math.Inf(-1))}, 2},
	} {
		if got := argmax(c.logits); got != c.want {
			t.Errorf("argmax(%v) = %d, want %d", c.logits, got, c.want)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 50 {
		l := make([]float32, 1+rng.IntN(70000))
		for i := range l {
			l[i] = float32(rng.NormFloat64())
		}
		want := 0
		for i, x := range l {
			if x > l[want] {
				want = i
			}
		}
		if got := argmax(l); got != want {
			t.Fatalf("%d logits: argmax %d, want %d", len(l), got, want)
		}
	}
}

// TestSamplersMatchChain: a greedy request's tokens through greedySampler,
// and a sampled one's through prefilterSampler, are the ones llama.cpp's
// whole sampler chain picks, on both engines; and only the requests each
// serves take them.
func TestSamplersMatchChain(t *testing.T) {
	cases := map[string]func(*parley.Params){
		"greedy":            func(p *parley.Params) { p.Temperature, p.RepeatPenalty = 0, 1 },
		"defaults":          func(*parley.Params) {},
		"greedy, penalties": func(p *parley.Params) { p.Temperature, p.RepeatPenalty, p.RepeatLastN = 0, 1.5, 12 },
		"hot, frequency": func(p *parley.Params) {
			p.Temperature, p.FrequencyPenalty, p.PresencePenalty, p.TopK = 1.5, 0.5, 0.3, 100
		},
		"top-k 1, typical, min-p": func(p *parley.Params) { p.TopK, p.TypicalP, p.MinP, p.TopP = 1, 0.9, 0.2, 0.5 },
	}
	eachEngine(t, func(t *testing.T, name string) {
		engines := samplingEngines(t, name, 2)
		engines[1].chainOnly = true
		for c, set := range cases {
			var replies [2][]int
			for i, e := range engines {
				p := parley.DefaultParams()
				p.MaxTokens, p.Seed = 96, 7
				set(&p)
				p.SkipLogprobs = i == 1
				if err := p.Validate(256); err != nil {
					t.Fatal(err)
				}
				s, _, err := e.newSampler(p, "test")
				if err != nil {
					t.Fatal(err)
				}
				_, isGreedy := s.(greedySampler)
				_, isPrefilter := s.(*prefilterSampler)
				if wantGreedy := i == 0 && c == "greedy"; isGreedy != wantGreedy || isPrefilter != (i == 0 && !wantGreedy) {
					t.Fatalf("%s, chainOnly %v: sampler %T", c, e.chainOnly, s)
				}
				replies[i] = replyIDs(t, e, "Once upon a time, there was a little", p)
			}
			if len(replies[0]) < 20 || !slices.Equal(replies[0], replies[1]) {
				t.Errorf("%s: Parley's sampler:\n%v\nthe chain:\n%v", c, replies[0], replies[1])
			}
		}
	})
	for _, c := range []struct {
		p    samplerParams
		want bool
	}{
		{samplerParams{Temp: 0, TypicalP: 1, PenaltyRepeat: 1, RepeatLastN: 64, TopK: 40, TopP: 0.9, MinP: 0.05}, true},
		{samplerParams{Temp: 0, TypicalP: 1, PenaltyRepeat: 1.1, RepeatLastN: 0}, true},
		{samplerParams{Temp: 0, TypicalP: 1, PenaltyRepeat: 1.1, RepeatLastN: 64}, false},
		{samplerParams{Temp: 0, TypicalP: 1, PenaltyRepeat: 1, PenaltyFreq: 0.5, RepeatLastN: 64}, false},
		{samplerParams{Temp: 0, TypicalP: 1, PenaltyRepeat: 1, PenaltyPre: 0.5, RepeatLastN: 64}, false},
		{samplerParams{Temp: 0, TypicalP: 0.5, PenaltyRepeat: 1}, false},
		{samplerParams{Temp: 0.7, TypicalP: 1, PenaltyRepeat: 1}, false},
	} {
		if got := plainGreedy(c.p); got != c.want {
			t.Errorf("plainGreedy(%+v) = %v", c.p, got)
		}
	}
}

// samplingEngines opens n engines of one kind on stories260K, one slot each,
// closed when t ends; the tests set each one's sampling flags.
func samplingEngines(t *testing.T, engine string, n int) []*Engine {
	t.Helper()
	es := make([]*Engine, n)
	for i := range es {
		e, err := Open(Config{Path: testmodel.Path(t), Threads: 1, Parallel: 1, ContextLength: 256, Engine: engine, LibDir: testLibDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		es[i] = e
	}
	return es
}

// TestTopK: topK against a sort, over random logits with ties, NaNs and
// skipped tokens, which it must leave as they were.
func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 300 {
		n := 1 + rng.IntN(3000)
		l := make([]float32, n)
		for i := range l {
			l[i] = float32(rng.IntN(200)) / 8 // many equal values
			if rng.IntN(50) == 0 {
				l[i] = float32(math.NaN())
			}
		}
		var skip []int32
		for _, i := range rng.Perm(n)[:rng.IntN(min(n, 40))] {
			skip = append(skip, int32(i))
		}
		k := 1 + rng.IntN(min(n, 300))
		before := slices.Clone(l)
		heap := make([]candidate, k)
		m := topK(l, k, skip, make([]float32, len(skip)), heap)
		for i := range l {
			if l[i] != before[i] && !(math.IsNaN(float64(l[i])) && math.IsNaN(float64(before[i]))) {
				t.Fatalf("logit %d changed: %v -> %v", i, before[i], l[i])
			}
		}
		var want []candidate
		for i, v := range l {
			if !slices.Contains(skip, int32(i)) && !math.IsNaN(float64(v)) {
				want = append(want, candidate{ID: int32(i), Logit: v})
			}
		}
		slices.SortStableFunc(want, byLogit)
		want = want[:min(k, len(want))]
		got := heap[:m]
		slices.SortFunc(got, byLogit)
		if !slices.Equal(got, want) {
			t.Fatalf("n %d k %d skip %d: top-k\n%v\nwant\n%v", n, k, len(skip), got, want)
		}
	}
}

// TestPenaltyWindow: the window holds the last lastN accepted tokens with
// their counts, as llama.cpp's ring buffer does.
func TestPenaltyWindow(t *testing.T) {
	w := newPenaltyWindow(samplerParams{RepeatLastN: 4, PenaltyRepeat: 2, PenaltyFreq: 0.5, PenaltyPre: 0.25})
	var all []int32
	for _, tok := range []int32{5, 6, 5, 7, 5, 8, 9, 9, 9, 5} {
		w.accept(tok)
		all = append(all, tok)
		want := map[int32]int32{}
		for _, x := range all[max(0, len(all)-4):] {
			want[x]++
		}
		if !maps.Equal(w.count, want) {
			t.Fatalf("after %v: counts %v, want %v", all, w.count, want)
		}
	}
	// The window is 9 9 9 5: 9 counted three times.
	if got, want := w.penalize(9, 3), float32(3.0/2-(3*0.5+0.25)); got != want {
		t.Errorf("penalize(9, 3) = %v, want %v", got, want)
	}
	if got, want := w.penalize(5, -3), float32(-3*2-(0.5+0.25)); got != want {
		t.Errorf("penalize(5, -3) = %v, want %v", got, want)
	}
	if off := newPenaltyWindow(samplerParams{RepeatLastN: 64, PenaltyRepeat: 1}); off.lastN != 0 {
		t.Error("neutral penalties keep a window")
	}
}

// logitsOnly is a backend whose every row holds the same logits.
type logitsOnly struct {
	backend
	l []float32
}

func (b logitsOnly) Logits(int) []float32 { return b.l }

// TestPrefilterSampler: the greedy draw after the penalties, a penalized
// token giving way, and logits that are no numbers at all, which must not
// bring the loop down.
func TestPrefilterSampler(t *testing.T) {
	p := samplerParams{TopK: 4, TopP: 1, TypicalP: 1, Temp: 0, RepeatLastN: 2, PenaltyRepeat: 4, Seed: 1}
	be := logitsOnly{l: []float32{1, 5, 3, 4.5, -2, 0, 2, 4}}
	s := &prefilterSampler{be: be, k: p.TopK, rank: newRanker(p), tail: newTailChain(p)}
	var got []int
	for range 4 {
		tok := s.Sample(0)
		s.Accept(tok)
		got = append(got, tok)
	}
	// 1 (5), then 3 (4.5; 1 is now 1.25), then 7 (4; both in the window),
	// then 1 again: the window holds the last two, 3 and 7.
	if want := []int{1, 3, 7, 1}; !slices.Equal(got, want) {
		t.Errorf("draws %v, want %v", got, want)
	}
	// Rows shorter than a token in the window (which no engine gives) are
	// no reason to write past them; rows of NaNs still give a token.
	nan := float32(math.NaN())
	s.be = logitsOnly{l: []float32{nan, nan, nan, nan, nan, nan}}
	if tok := s.Sample(0); tok < 0 || tok >= 6 {
		t.Errorf("all-NaN logits: token %d", tok)
	}
	s.rank.win = newPenaltyWindow(p)
	if tok := s.Sample(0); tok != 0 {
		t.Errorf("all-NaN logits, nothing in the window: token %d, want 0", tok)
	}
}

// TestGrammarRankedDraws: grammar-constrained replies that ask the grammar
// about the largest logits first (greedy, and sampled with a top-k) give the
// same tokens as masking the whole vocabulary before every draw, on both
// engines, with penalties too.
func TestGrammarRankedDraws(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"story":{"type":"string"},"n":{"type":"integer"}},"required":["story","n"]}`)
	cases := []struct {
		name   string
		set    func(*parley.Params)
		ranked bool // some draws decided from the ranking alone
	}{
		{"greedy", func(p *parley.Params) { p.Temperature, p.RepeatPenalty = 0, 1 }, true},
		{"greedy, top-k off", func(p *parley.Params) { p.Temperature, p.RepeatPenalty, p.TopK = 0, 1, 0 }, true},
		{"defaults", func(*parley.Params) {}, true},
		{"hot, penalties, top-k 8", func(p *parley.Params) {
			p.Temperature, p.TopK, p.RepeatPenalty, p.FrequencyPenalty, p.PresencePenalty, p.RepeatLastN = 1.3, 8, 1.3, 0.4, 0.2, 16
		}, true},
		{"greedy, penalties", func(p *parley.Params) { p.Temperature, p.RepeatPenalty, p.RepeatLastN = 0, 1.5, 12 }, true},
		{"top-k 1000 (the whole chain)", func(p *parley.Params) { p.TopK = 1000 }, false},
		// Characters of two bytes, which this vocabulary writes a byte at a
		// time: the grammar then waits for a character's second byte.
		{"defaults, a grammar of two-byte characters", func(p *parley.Params) {
			p.JSONSchema, p.Grammar = nil, `root ::= (("é" | "ü") [a-z ]{1,3}){4,12} "."`
		}, true},
	}
	eachEngine(t, func(t *testing.T, name string) {
		// The ranked draws over the shared vocabulary and over a copy of
		// their own, and masking every draw.
		engines := samplingEngines(t, name, 3)
		engines[1].ownVocab, engines[2].chainOnly = true, true
		for _, c := range cases {
			for _, seed := range []int64{3, 11, 29} {
				var replies [3][]int
				var ranked [3]int64
				for i, e := range engines {
					p := parley.DefaultParams()
					p.MaxTokens, p.Seed = 80, seed
					p.JSONSchema = schema
					c.set(&p)
					if err := p.Validate(256); err != nil {
						t.Fatal(err)
					}
					before := e.grammarRanked.Load()
					replies[i] = replyIDs(t, e, "Once upon a time, there was a little", p)
					e.samplers.Wait() // the sampler's goroutine has counted its draws
					ranked[i] = e.grammarRanked.Load() - before
				}
				if len(replies[0]) < 5 || !slices.Equal(replies[0], replies[2]) || !slices.Equal(replies[1], replies[2]) {
					t.Errorf("%s, seed %d: ranked:\n%v\nover a copy of the vocabulary:\n%v\nmasking every draw:\n%v", c.name, seed, replies[0], replies[1], replies[2])
				}
				if (ranked[0] > 0) != c.ranked || ranked[1] != ranked[0] || ranked[2] != 0 {
					t.Errorf("%s, seed %d: draws decided from the ranking: %d (want some: %v), %d over a copy, %d masking every draw", c.name, seed, ranked[0], c.ranked, ranked[1], ranked[2])
				}
				t.Logf("%s, seed %d: %d tokens, %d decided from the ranking", c.name, seed, len(replies[0]), ranked[0])
			}
		}
	})
}

// BenchmarkGrammar: a JSON-schema reply's rate, greedy and with the default
// sampling: ranking the candidates first, with and without masking the
// vocabulary by its prefixes' groups when that fails, and masking every
// draw, token by token; on
// PARLEY_BENCH_MODEL (a model with a real vocabulary, such as
// scripts/bench-models.sh's padded ones; skipped without it) on
// PARLEY_BENCH_ENGINE (default current).
func BenchmarkGrammar(b *testing.B) {
	model := os.Getenv("PARLEY_BENCH_MODEL")
	if model == "" {
		b.Skip("PARLEY_BENCH_MODEL not set")
	}
	engine := cmp.Or(os.Getenv("PARLEY_BENCH_ENGINE"), EngineCurrent)
	// A tool call's shape: keys, a number, a short list, and a text long
	// enough that a sampled reply does not close it at once.
	schema := json.RawMessage(`{"type":"object","properties":{"title":{"type":"string","maxLength":40},"year":{"type":"integer"},` +
		`"tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":3},"story":{"type":"string","minLength":60}},` +
		`"required":["title","year","tags","story"]}`)
	for _, sampling := range []string{"greedy", "default"} {
		for _, mode := range []string{"ranked+groups", "ranked", "mask-every-draw"} {
			b.Run(sampling+"/"+mode, func(b *testing.B) {
				e, err := Open(Config{Path: model, Threads: 2, Parallel: 1, ContextLength: 512, Engine: engine, LibDir: testLibDir()})
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				e.chainOnly, e.noGroups = mode == "mask-every-draw", mode == "ranked"
				tokens := 0
				for b.Loop() {
					p := parley.DefaultParams()
					p.MaxTokens, p.Seed = 192, 1
					if sampling == "greedy" {
						p.Temperature, p.RepeatPenalty = 0, 1
					}
					p.JSONSchema = schema
					if err := p.Validate(512); err != nil {
						b.Fatal(err)
					}
					tokens += len(replyIDs(b, e, "Once upon a time, there was a little", p))
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tok/s")
				b.ReportMetric(float64(e.grammarRanked.Load())/float64(max(tokens, 1)), "ranked/tok")
			})
		}
	}
}

// replyIDs generates p's reply to prompt on e and returns its tokens; the
// reply must end at its length or at an end-of-generation token.
func replyIDs(tb testing.TB, e *Engine, prompt string, p parley.Params) []int {
	tb.Helper()
	toks, err := e.Tokenize(prompt)
	if err != nil {
		tb.Fatal(err)
	}
	events, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: p})
	if err != nil {
		tb.Fatal(err)
	}
	var ids []int
	for ev := range events {
		if ev.Done {
			if ev.Err != nil || ev.Finish != parley.FinishLength && ev.Finish != parley.FinishEOS {
				tb.Fatalf("finish %q: %v", ev.Finish, ev.Err)
			}
			continue
		}
		ids = append(ids, ev.Token.ID)
	}
	return ids
}

// TestGroupByPrefix: tokens that begin with the same whole character, and
// the same two, at least minGroup of them, share a group; the rest are in
// none.
func TestGroupByPrefix(t *testing.T) {
	pieces := []string{"a", "ab", "abc", "ad", "b", "é", "éa", "éb", "éc", "\xc3", "\xc3x", "\xc3y", "\xc3z", "", "\x00a", "</s>", "x",
		"abd", "a\xc3", "a\xc3\xa9", "abe"}
	isEOG := make([]bool, len(pieces))
	isEOG[15] = true
	pg := groupByPrefix(pieces, isEOG)
	first := []int32{0, 0, 0, 0, -1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0}
	second := []int32{-1, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, -1, -1, 0}
	if pg.n1 != 2 || pg.n2 != 1 || !slices.Equal(pg.first, first) || !slices.Equal(pg.second, second) ||
		!slices.Equal(pg.parent, []int32{0}) || !slices.Equal(pg.prefixes, []string{"a", "é", "ab"}) {
		t.Errorf("groups %+v", pg)
	}
}

// TestGroupsOnlyForCharacterGrammars: a grammar with a token element
// (which matches token ids, not characters) never masks by first character;
// and all grammars share one copy of the vocabulary until Close.
func TestGroupsOnlyForCharacterGrammars(t *testing.T) {
	e, err := Open(Config{Path: testmodel.Path(t), Threads: 1, Parallel: 1, ContextLength: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sp := e.samplerParams(parley.DefaultParams())
	for grammar, want := range map[string]bool{
		`root ::= [a-z ]+ "."`:    true,
		`root ::= <[1]> [a-z ]+`:  false,
		`root ::= !<[1]> [a-z ]+`: false,
	} {
		cg, err := e.compileGrammar(grammar, sp)
		if err != nil {
			t.Fatalf("%s: %v", grammar, err)
		}
		if cg.grouped() != want {
			t.Errorf("%s: by first character %v, want %v", grammar, cg.grouped(), want)
		}
		cg.free()
	}
	gv := e.grammarVocab()
	if gv.groups.n1 == 0 || gv.groups.n2 == 0 {
		t.Errorf("stories260K's vocabulary: %d first-character groups and %d two-character ones", gv.groups.n1, gv.groups.n2)
	}
	// Every grammar reads one copy of the vocabulary, freed at Close; one
	// compiled after that builds its own.
	if gv.shared == nil {
		t.Error("no shared vocabulary")
	}
	e.Close()
	if gv.shared != nil {
		t.Error("the shared vocabulary outlived Close")
	}
	cg, err := e.compileGrammar(`root ::= [a-z ]+ "."`, sp)
	if err != nil {
		t.Fatal(err)
	}
	cg.free()
}

// BenchmarkCompileGrammar: what a grammar-constrained request costs before
// its first token: compiling a JSON schema's grammar over the vocabulary of
// PARLEY_BENCH_MODEL (skipped without it).
func BenchmarkCompileGrammar(b *testing.B) {
	model := os.Getenv("PARLEY_BENCH_MODEL")
	if model == "" {
		b.Skip("PARLEY_BENCH_MODEL not set")
	}
	e, err := Open(Config{Path: model, Threads: 2, Parallel: 1, ContextLength: 512, LibDir: testLibDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	p := parley.DefaultParams()
	p.JSONSchema = json.RawMessage(`{"type":"object","properties":{"story":{"type":"string"}},"required":["story"]}`)
	if err := p.Validate(512); err != nil {
		b.Fatal(err)
	}
	grammar, _, _ := p.CheckedGrammar()
	e.grammarVocab()
	for b.Loop() {
		cg, err := e.compileGrammar(grammar, e.samplerParams(p))
		if err != nil {
			b.Fatal(err)
		}
		cg.free()
	}
}
