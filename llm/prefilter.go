package llm

import (
	"math"
	"slices"
)

// maxPrefilterK is the largest top-k that prefilterSampler takes; a larger
// one (or none) goes through the engine's whole sampler chain.
const maxPrefilterK = 256

// tokenData is llama_token_data: a token, its logit and its probability.
type tokenData struct {
	ID    int32
	Logit float32
	P     float32
}

// prefilterSampler is the engine's sampler chain (penalties, top-k,
// typical, top-p, min-p, temperature, a seeded draw) with its first two
// links done here: the penalties touch only the tokens in their window and
// top-k scans the logits in place (topK), so the rest of the chain gets k
// candidates. llama.cpp's chain copies the whole vocabulary into a
// candidate array, looks every token up in the penalties' hash map and
// sorts for top-k at every token: with a 49,152-token vocabulary and
// Parley's defaults, 1.3% of a 2-thread decode's CPU samples against this
// sampler's 0.13% (docs/notes/2026-11-27-vocabulary-work.md).
// The tokens it draws are the chain's (TestSamplersMatchChain), but for the
// order of equal logits.
type prefilterSampler struct {
	be   backend
	k    int
	rank ranker
	tail tail
}

func newPrefilterSampler(be backend, p samplerParams) (*prefilterSampler, error) {
	t, err := be.NewTail(p)
	if err != nil {
		return nil, err
	}
	return &prefilterSampler{be: be, k: p.TopK, rank: newRanker(p), tail: t}, nil
}

// prefilterable reports whether prefilterSampler gives p's draws: a top-k
// of at most maxPrefilterK that cuts the vocabulary.
func prefilterable(p samplerParams, nVocab int) bool {
	return p.TopK > 0 && p.TopK <= maxPrefilterK && p.TopK < nVocab
}

func (s *prefilterSampler) Sample(i int) int {
	logits := s.be.Logits(i)
	td, _ := s.rank.top(logits, s.k)
	td = td[:min(s.k, len(td))]
	if tok := s.tail.draw(td); tok >= 0 {
		return tok
	}
	// The chain chose none (llama.cpp's own sampler would abort), or no
	// logit was a number: the likeliest, as greedy decoding would take.
	if len(td) > 0 {
		return int(s.rank.cands[0].ID)
	}
	return argmax(logits)
}

func (s *prefilterSampler) Accept(tok int) { s.rank.win.accept(int32(tok)) }

// ranker finds the largest logits of a row after the penalties without
// copying or sorting the row: topK scans it in place with the window's
// tokens left out, and those few are added after their penalties.
type ranker struct {
	win penaltyWindow

	// Buffers reused at every token.
	skip  []int32
	saved []float32
	heap  []candidate
	cands []candidate
	td    []tokenData
}

func newRanker(p samplerParams) ranker { return ranker{win: newPenaltyWindow(p)} }

// top returns the m largest logits of the row after the penalties, largest
// first (of equal ones the earlier token), followed by any of the window's
// tokens that fall below them; and bound: no token left out has a larger
// logit (-inf when none is left out but NaNs). The slice is r's, rewritten
// by the next call.
func (r *ranker) top(logits []float32, m int) (td []tokenData, bound float32) {
	r.skip = r.win.tokens(r.skip[:0], len(logits))
	if cap(r.saved) < len(r.skip) {
		r.saved = make([]float32, len(r.skip))
	}
	if len(r.heap) < m {
		r.heap = make([]candidate, m)
	}
	n := topK(logits, m, r.skip, r.saved[:len(r.skip)], r.heap)
	bound = float32(math.Inf(-1))
	if n == m {
		bound = float32(math.Inf(1))
		for _, c := range r.heap[:n] {
			bound = min(bound, c.Logit)
		}
	}
	r.cands = append(r.cands[:0], r.heap[:n]...)
	for _, id := range r.skip {
		r.cands = append(r.cands, candidate{ID: id, Logit: r.win.penalize(id, logits[id])})
	}
	slices.SortFunc(r.cands, byLogit)
	r.td = r.td[:0]
	for _, c := range r.cands {
		r.td = append(r.td, tokenData{ID: c.ID, Logit: c.Logit})
	}
	return r.td, bound
}

// byLogit orders candidates as top-k leaves them: the largest logit first,
// and of equal ones the earlier token.
func byLogit(a, b candidate) int {
	switch {
	case a.Logit > b.Logit:
		return -1
	case a.Logit < b.Logit:
		return 1
	}
	return int(a.ID - b.ID)
}

// penaltyWindow is llama.cpp's penalties sampler: the last lastN accepted
// tokens with their counts, and the repetition, frequency and presence
// penalties it applies to those tokens' logits.
type penaltyWindow struct {
	lastN                  int
	repeat, freq, presence float32
	ring                   []int32 // the window, oldest at head once full
	head                   int
	count                  map[int32]int32
}

func newPenaltyWindow(p samplerParams) penaltyWindow {
	w := penaltyWindow{lastN: max(p.RepeatLastN, 0), repeat: p.PenaltyRepeat, freq: p.PenaltyFreq, presence: p.PenaltyPre}
	if w.off() {
		w.lastN = 0
	}
	w.count = map[int32]int32{}
	return w
}

// off is llama.cpp's is_disabled: no window, or no penalty to apply.
func (w *penaltyWindow) off() bool {
	return w.lastN == 0 || w.repeat == 1 && w.freq == 0 && w.presence == 0
}

func (w *penaltyWindow) accept(tok int32) {
	if w.lastN == 0 {
		return
	}
	w.count[tok]++
	if len(w.ring) < w.lastN {
		w.ring = append(w.ring, tok)
		return
	}
	old := w.ring[w.head]
	if w.count[old]--; w.count[old] == 0 {
		delete(w.count, old)
	}
	w.ring[w.head] = tok
	w.head = (w.head + 1) % w.lastN
}

// tokens appends the window's distinct tokens below n (the vocabulary:
// the scan of the logits writes at these indexes) to dst.
func (w *penaltyWindow) tokens(dst []int32, n int) []int32 {
	for tok := range w.count {
		if tok >= 0 && int(tok) < n {
			dst = append(dst, tok)
		}
	}
	return dst
}

// penalize is the logit of tok (in the window) after the penalties, in
// llama.cpp's float32 arithmetic.
func (w *penaltyWindow) penalize(tok int32, logit float32) float32 {
	if logit <= 0 {
		logit *= w.repeat
	} else {
		logit /= w.repeat
	}
	c := w.count[tok]
	var present float32
	if c > 0 {
		present = 1
	}
	return logit - (float32(c)*w.freq + present*w.presence)
}
