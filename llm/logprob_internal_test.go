package llm

import (
	"context"
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

// TestGreedyMatchesChain: a greedy request's tokens through greedySampler
// are the ones llama.cpp's sampler chain picks, on both engines, with and
// without logprobs; and only plain greedy requests take it.
func TestGreedyMatchesChain(t *testing.T) {
	for _, name := range []string{EngineEmbedded, EngineCurrent} {
		if name == EngineCurrent && os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") == "1" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			var replies [2][]int
			for i, chain := range []bool{false, true} {
				e, err := Open(Config{Path: testmodel.Path(t), Threads: 1, Parallel: 1, ContextLength: 256, Engine: name, LibDir: testLibDir()})
				if err != nil {
					t.Fatal(err)
				}
				e.chainOnly = chain
				p := parley.DefaultParams()
				p.Temperature, p.RepeatPenalty, p.MaxTokens, p.Seed = 0, 1, 96, 1
				p.SkipLogprobs = chain
				if err := p.Validate(256); err != nil {
					t.Fatal(err)
				}
				if s, _, err := e.newSampler(p, "test"); err != nil {
					t.Fatal(err)
				} else if _, fast := s.(greedySampler); fast == chain {
					t.Fatalf("chainOnly %v: sampler %T", chain, s)
				}
				toks, err := e.Tokenize("Once upon a time, there was a little")
				if err != nil {
					t.Fatal(err)
				}
				events, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: p})
				if err != nil {
					t.Fatal(err)
				}
				for ev := range events {
					if ev.Done {
						if ev.Err != nil || ev.Finish != parley.FinishLength && ev.Finish != parley.FinishEOS {
							t.Fatalf("finish %q: %v", ev.Finish, ev.Err)
						}
						break
					}
					replies[i] = append(replies[i], ev.Token.ID)
				}
				e.Close()
			}
			if len(replies[0]) < 20 || !slices.Equal(replies[0], replies[1]) {
				t.Fatalf("greedySampler:\n%v\nthe chain:\n%v", replies[0], replies[1])
			}
		})
	}
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
