package llm

import (
	"math"
	"math/rand/v2"
	"testing"
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
