package llm

/*
#include <stdbool.h>
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

// parley_max returns the largest of l[0..n) (NaNs never win; -inf for
// none), eight lanes at a time.
static float parley_max(const float *l, int64_t n) {
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
	return m;
}

// parley_logsumexp returns log-sum-exp's two parts over l[0..n) scaled by
// s > 0: *max = max(l[i]), and the sum of exp((l[i] - *max) * s) (at least
// 1: the largest term is exp(0)). The difference comes first: l[i] * s -
// max * s would lose the low digits of large scaled logits. Terms below e^-80 count as e^-80,
// which no sum of a vocabulary's worth of them can make visible.
static double parley_logsumexp(const float *l, int64_t n, float s, float *max) {
	float m = parley_max(l, n);
	int64_t i, body = n & ~(int64_t)7;
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
	float m = parley_max(l, n);
	for (int64_t i = 0; i < n; i++) {
		if (l[i] == m) {
			return i;
		}
	}
	return 0;
}
// parley_cand is a top-k candidate: a token and its logit.
typedef struct { int32_t id; float v; } parley_cand;

// parley_worse orders the top-k heap: the lower logit, and of equal ones
// the later token, is worse (so ties keep the earlier token).
static inline bool parley_worse(parley_cand a, parley_cand b) {
	return a.v < b.v || (a.v == b.v && a.id > b.id);
}

static void parley_sift(parley_cand *h, int32_t n, int32_t i) {
	for (;;) {
		int32_t w = i, l = 2 * i + 1, r = l + 1;
		if (l < n && parley_worse(h[l], h[w])) w = l;
		if (r < n && parley_worse(h[r], h[w])) w = r;
		if (w == i) return;
		parley_cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

static inline void parley_offer(parley_cand *h, int32_t k, int64_t i, float v) {
	if (v > h[0].v) {
		h[0].id = (int32_t)i;
		h[0].v = v;
		parley_sift(h, k, 0);
	}
}

// parley_topk writes the k largest of l[0..n) (k > 0), in no order, to
// heap and returns how many it found (fewer than k only when fewer
// tokens are left), leaving out the tokens skip[0..nskip) (distinct, in
// range) and NaNs. The skipped logits are set aside in saved[0..nskip) and
// put back before it returns. After the first k, a block of eight logits
// costs one vector comparison with the k-th largest so far.
static int32_t parley_topk(float *l, int64_t n, int32_t k, const int32_t *skip, int32_t nskip,
		float *saved, parley_cand *heap) {
	for (int32_t j = 0; j < nskip; j++) {
		saved[j] = l[skip[j]];
		l[skip[j]] = __builtin_nanf("");
	}
	int32_t m = 0;
	int64_t i = 0;
	for (; i < n && m < k; i++) {
		if (l[i] == l[i]) {
			heap[m].id = (int32_t)i;
			heap[m].v = l[i];
			m++;
		}
	}
	if (m == k) {
		for (int32_t j = k / 2 - 1; j >= 0; j--) {
			parley_sift(heap, k, j);
		}
		for (; i + 8 <= n; i += 8) {
			parley_v8f v, thr = {0};
			memcpy(&v, l + i, sizeof v);
			thr += heap[0].v;
			parley_v8i gt = v > thr;
			if ((gt[0] | gt[1] | gt[2] | gt[3] | gt[4] | gt[5] | gt[6] | gt[7]) == 0) {
				continue;
			}
			for (int j = 0; j < 8; j++) {
				parley_offer(heap, k, i + j, l[i + j]);
			}
		}
		for (; i < n; i++) {
			parley_offer(heap, k, i, l[i]);
		}
	}
	for (int32_t j = 0; j < nskip; j++) {
		l[skip[j]] = saved[j];
	}
	return m;
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

// candidate is a token and its logit: parley_cand's layout.
type candidate struct {
	ID    int32
	Logit float32
}

// topK writes the k largest logits (k > 0), in no order, into heap
// (len(heap) >= k) and returns how many it found; the tokens in skip
// (distinct, in range; saved as long) are left out. It writes into logits
// while it runs (llama.cpp's buffer, read in place) and restores them.
func topK(logits []float32, k int, skip []int32, saved []float32, heap []candidate) int {
	if len(logits) == 0 || k <= 0 {
		return 0
	}
	var sk *C.int32_t
	var sv *C.float
	if len(skip) > 0 {
		sk, sv = (*C.int32_t)(unsafe.Pointer(&skip[0])), (*C.float)(unsafe.Pointer(&saved[0]))
	}
	return int(C.parley_topk((*C.float)(unsafe.Pointer(&logits[0])), C.int64_t(len(logits)), C.int32_t(k),
		sk, C.int32_t(len(skip)), sv, (*C.parley_cand)(unsafe.Pointer(&heap[0]))))
}
