package llm

/*
#include <stdint.h>
#include <string.h>

// Eight floats (and eight doubles) as GCC/Clang vector extensions: AVX2
// registers with Parley's -march=x86-64-v3, pairs of SSE registers on
// plainer targets. Explicit lanes, because a compiler may not vectorise a
// floating-point reduction written as one loop without -ffast-math.
typedef float   parley_v8f __attribute__((vector_size(32)));
typedef int32_t parley_v8i __attribute__((vector_size(32)));
typedef double  parley_v8d __attribute__((vector_size(64)));

// parley_sel8 is m ? a : b lane by lane (m from a vector comparison: all
// ones or zeros); C has no ?: on vectors.
static inline parley_v8f parley_sel8(parley_v8i m, parley_v8f a, parley_v8f b) {
	return (parley_v8f)((m & (parley_v8i)a) | (~m & (parley_v8i)b));
}

// parley_exp8 is exp(x) for x in [-80, 0], lane by lane, within about
// 2e-7 relative: x = (k + f) ln 2 with k an integer and |f| <= 1/2, 2^f by
// a degree-7 Taylor polynomial of e^(f ln 2), and 2^k added to the
// exponent bits (k >= -116 here, so the result stays a normal float).
static inline parley_v8f parley_exp8(parley_v8f x) {
	const parley_v8f half = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
	parley_v8f t = x * 1.4426950408889634f;                      // x / ln 2, <= 0
	parley_v8i k = -__builtin_convertvector(half - t, parley_v8i); // round(t): 0.5 - t > 0 truncates to its floor
	parley_v8f y = (t - __builtin_convertvector(k, parley_v8f)) * 0.6931471805599453f;
	parley_v8f p = 1.0f + y * (1.0f + y * (0.5f + y * (1.0f / 6 + y * (1.0f / 24 +
		y * (1.0f / 120 + y * (1.0f / 720 + y * (1.0f / 5040)))))));
	return (parley_v8f)((parley_v8i)p + (k << 23));
}

// parley_logsumexp returns log-sum-exp's two parts over l[0..n) scaled by
// s > 0: *max = max(l[i]), and the sum of exp((l[i] - *max) * s) (at least
// 1: the largest term is exp(0)). The difference comes first: l[i] * s -
// max * s would lose the low digits of large scaled logits. Terms below e^-80 count as e^-80,
// which no sum of a vocabulary's worth of them can make visible.
static double parley_logsumexp(const float *l, int64_t n, float s, float *max) {
	parley_v8f mv;
	float m = -__builtin_inff();
	int64_t i = 0, body = n & ~(int64_t)7;
	if (body > 0) {
		memcpy(&mv, l, sizeof mv);
		for (i = 8; i < body; i += 8) {
			parley_v8f v;
			memcpy(&v, l + i, sizeof v);
			mv = parley_sel8(v > mv, v, mv);
		}
		for (int j = 0; j < 8; j++) {
			m = mv[j] > m ? mv[j] : m;
		}
	}
	for (i = body; i < n; i++) {
		m = l[i] > m ? l[i] : m;
	}
	*max = m;

	const parley_v8f lo = {-80, -80, -80, -80, -80, -80, -80, -80};
	parley_v8d acc = {0};
	for (i = 0; i < body; i += 8) {
		parley_v8f v;
		memcpy(&v, l + i, sizeof v);
		v = (v - m) * s;
		v = parley_sel8(v < lo, lo, v); // also turns -inf into -80
		acc += __builtin_convertvector(parley_exp8(v), parley_v8d);
	}
	double sum = 0;
	for (int j = 0; j < 8; j++) {
		sum += acc[j];
	}
	for (i = body; i < n; i++) {
		parley_v8f v = {(l[i] - m) * s};
		v = parley_sel8(v < lo, lo, v);
		sum += parley_exp8(v)[0];
	}
	return sum;
}
// parley_argmax returns the index of the first largest of l[0..n), n > 0
// (NaNs never win, unless all are NaN: then 0).
static int64_t parley_argmax(const float *l, int64_t n) {
	float m = -__builtin_inff();
	int64_t i = 0, body = n & ~(int64_t)7;
	if (body > 0) {
		parley_v8f mv;
		memcpy(&mv, l, sizeof mv);
		for (i = 8; i < body; i += 8) {
			parley_v8f v;
			memcpy(&v, l + i, sizeof v);
			mv = parley_sel8(v > mv, v, mv);
		}
		for (int j = 0; j < 8; j++) {
			m = mv[j] > m ? mv[j] : m;
		}
	}
	for (i = body; i < n; i++) {
		m = l[i] > m ? l[i] : m;
	}
	for (i = 0; i < n; i++) {
		if (l[i] == m) {
			return i;
		}
	}
	return 0;
}
*/
import "C"

import (
	"math"
	"unsafe"
)

// logprob returns log softmax(logits / temp)[tok]. Greedy sampling (temp <= 0)
// reports the model's own distribution (temp 1).
//
// It runs for every token of every reply whose client reads log-probabilities
// (WebSocket JSON, OpenAI logprobs, the JSON-lines stream), on the loop that
// decodes them all. The plain float64 loop over math.Exp took 1.3 ms per
// token for a 49,152-token vocabulary on the 2-core machine, 10-18% of a
// small model's decode step; the vectorised C below takes a few dozen
// microseconds, within about 1e-6 of it (TestLogprobMatchesFloat64).
func logprob(logits []float32, tok int, temp float64) float64 {
	if tok < 0 || tok >= len(logits) {
		return math.NaN()
	}
	if temp <= 0 {
		temp = 1
	}
	var maxL C.float
	sum := C.parley_logsumexp((*C.float)(unsafe.Pointer(&logits[0])), C.int64_t(len(logits)), C.float(1/temp), &maxL)
	lp := (float64(logits[tok])-float64(maxL))/temp - math.Log(float64(sum))
	return min(lp, 0) // rounding can put the largest term a hair past 0; NaN stays NaN
}

// argmax returns the index of the first largest logit (0 for an empty or
// all-NaN row).
func argmax(logits []float32) int {
	if len(logits) == 0 {
		return 0
	}
	return int(C.parley_argmax((*C.float)(unsafe.Pointer(&logits[0])), C.int64_t(len(logits))))
}

// greedySampler takes the largest logit: what llama.cpp's sampler chain
// chooses when the temperature is 0 and no penalty or typical-p filter can
// demote that token, without its work per token (a candidate array as long as
// the vocabulary, a top-k sort). It reads llama.cpp's logits in place.
type greedySampler struct{ be backend }

func (g greedySampler) Sample(i int) int { return argmax(g.be.Logits(i)) }
func (g greedySampler) Accept(int)       {}

// plainGreedy reports whether p (the sampler a sequence asked for) always
// takes the largest logit, so greedySampler gives its tokens: temperature 0,
// no repetition, frequency or presence penalty, typical-p off. Top-k, top-p
// and min-p always keep the largest logit.
func plainGreedy(p samplerParams) bool {
	return p.Temp <= 0 && p.TypicalP >= 1 &&
		(p.RepeatLastN == 0 || p.PenaltyRepeat == 1 && p.PenaltyFreq == 0 && p.PenaltyPre == 0)
}
