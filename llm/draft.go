package llm

import "fmt"

// Speculative decoding from the conversation itself: a generating sequence
// whose last tokens occurred earlier in its slot's history (the prompt, which
// holds the conversation's earlier turns, and the reply so far) appends what
// followed them there to its decode step as a draft. The step's logits for
// every drafted position verify the draft at once: the sequence's own
// sampler draws a token from each row in order, and the draft holds while
// the drawn token is the drafted one. The first token that differs (or the
// one drawn after the whole draft) is emitted like any token and is the next
// step's input; the drafted tokens after it leave the KV cache (seq_rm).
//
// Drawing from the target distribution and comparing is the standard
// acceptance rule for a draft of one certain token (q(d) = 1): the draft is
// kept with probability p(d), and when it is not, the token drawn is
// distributed as p without d, renormalized. So the sampling distribution is
// exactly the model's. Each emitted token is drawn once, in order, by the
// same sampler (its penalties' window, its seeded random draw, its grammar)
// as in plain decoding, and no draw is made for a row past the first miss:
// given the same logits, the tokens are those of plain decoding, greedy or
// sampled with a seed (TestDraftSampledExact checks this over logits that
// depend on each row alone).
//
// llama.cpp's logits are not quite the same: a step that evaluates several
// positions of one sequence (its input and draft) sums in another order
// than a step of one, which moves stories260K's log-probabilities by up to
// about 1e-2. A seeded draw that lands within that distance of the boundary
// between two tokens then takes the other one, and the reply goes on
// differently from there (stories260K at temperature 0.8 under a grammar:
// 1 reply of 20, one token in about 1,600); a greedy reply can differ only
// where its two likeliest tokens are that close. Plain continuous batching
// has the same effect, smaller (a step's other sequences move the logits by
// about 1e-6).
//
// Draft tokens cost a decode step time; what they return depends on how
// often they hold. In auto mode the step times the loop measures, kept by
// the step's shape (draftcost.go), decide whether a draft is worth its
// place in the step; each sequence's acceptance estimate (draftState)
// backs its drafts off when they miss.

// Draft modes (Config.Draft).
const (
	DraftAuto  = "auto"  // draft where the measured step costs say a draft token pays for itself
	DraftNgram = "ngram" // draft whenever the history offers a continuation, up to DraftMax tokens
	DraftOff   = "off"   // never draft
)

// DefaultDraftMax is the longest draft one sequence appends to a step.
const DefaultDraftMax = 8

// N-gram lengths the lookup tries, longest first: a longer match predicts
// its continuation better; a single token matches too much.
const (
	draftMaxN = 4
	draftMinN = 2
)

// maxDraftTable bounds a slot's n-gram table (entries of 4 bytes): a history
// longer than this many tokens per n-gram length loses some older matches to
// collisions, never memory.
const maxDraftTable = 1 << 18

// ngramIndex is a slot's history (the tokens its KV cache holds, then the
// token to decode next) and a table from the hash of each n-gram in it
// (draftMinN to draftMaxN tokens) to the index of the token that followed
// its latest occurrence. Collisions overwrite, and a history that is cut
// back (a new prompt that shares only a prefix) leaves stale entries: a
// lookup checks that the tokens before an entry are the n-gram it looks for,
// so only the history's own tokens are ever drafted. Owned by the loop.
type ngramIndex struct {
	toks    []int
	table   []int32 // hash -> index of the continuation + 1 (0: empty); nil until the first lookup
	mask    uint64
	indexed int // the n-grams followed by toks[:indexed] are in the table
	maxLen  int // the history's longest length (the slot's context)
}

func newNgramIndex(maxLen int) *ngramIndex { return &ngramIndex{maxLen: maxLen} }

// reset makes toks the history, keeping the table's entries for the prefix
// it shares with the old one.
func (x *ngramIndex) reset(toks []int) {
	keep := commonPrefix(x.toks, toks)
	x.toks = append(x.toks[:keep], toks[keep:]...)
	x.cut(keep)
}

// cut notes that the history was cut back to n tokens. The entries of the
// n-grams in what is left may have been overwritten by occurrences in what
// was cut: the next lookup enters the whole history again (a hash per
// token and length: a prompt's worth once per request at most).
func (x *ngramIndex) cut(n int) {
	if n < x.indexed {
		x.indexed = 0
	}
}

// push appends a token to the history.
func (x *ngramIndex) push(tok int) { x.toks = append(x.toks, tok) }

// truncate cuts the history back to n tokens.
func (x *ngramIndex) truncate(n int) {
	if n < len(x.toks) {
		x.toks = x.toks[:n]
		x.cut(n)
	}
}

func ngramHash(toks []int) uint64 {
	h := uint64(len(toks)) * 0x9e3779b97f4a7c15
	for _, t := range toks {
		h ^= uint64(uint32(t))
		h *= 0xff51afd7ed558ccd
		h ^= h >> 32
	}
	return h
}

// catchUp enters the n-grams whose continuation is in the history.
func (x *ngramIndex) catchUp() {
	if x.table == nil {
		size := 1
		for size < 2*(draftMaxN-draftMinN+1)*x.maxLen && size < maxDraftTable {
			size <<= 1
		}
		x.table, x.mask = make([]int32, size), uint64(size-1)
	}
	for e := max(x.indexed, draftMinN); e < len(x.toks); e++ {
		for n := draftMinN; n <= draftMaxN && n <= e; n++ {
			x.table[ngramHash(x.toks[e-n:e])&x.mask] = int32(e + 1)
		}
	}
	x.indexed = len(x.toks)
}

// lookup returns up to k tokens that followed the latest earlier
// occurrence of the history's longest matching suffix (draftMinN tokens at
// least), up to the first image position, appended to dst[:0]; none when
// there is none.
func (x *ngramIndex) lookup(dst []int, k int) []int {
	dst = dst[:0]
	if k <= 0 || len(x.toks) < draftMinN+1 {
		return dst
	}
	x.catchUp()
	l := len(x.toks)
	for n := min(draftMaxN, l-1); n >= draftMinN; n-- {
		suffix := x.toks[l-n:]
		e := int(x.table[ngramHash(suffix)&x.mask]) - 1
		if e < n || e >= l || !equalInts(x.toks[e-n:e], suffix) {
			continue
		}
		// A draft ends before an image's positions (negative pseudo ids):
		// they are no tokens a step can decode.
		for _, t := range x.toks[e:min(e+k, l)] {
			if t < 0 {
				break
			}
			dst = append(dst, t)
		}
		return dst
	}
	return dst
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// draftState is one sequence's acceptance estimate: how likely the next
// draft token is to hold, given that the ones before it did. Each draft's
// outcome is a run of kept tokens ended by at most one miss, so the estimate
// of that geometric chance is kept/(kept+misses), over counts that decay
// with every token tried (the last few weigh most, so a reply that stops
// repeating its prompt backs off within a few steps), from a prior of
// draftPrior of a token of each. The counts hold about 1/(1-draftDecay)
// tokens, so the prior's weight bounds the estimate after drafts that all
// held: a light prior lets it reach the 0.97 at which a draft of 8 tokens
// is worth its length (a prior of half a token each held it at 0.885,
// where the 8th token's chance is 0.38). Counts decay a little at every
// step without a draft as well, so a sequence whose drafts stopped for
// missing tries again later.
type draftState struct {
	kept, missed float64
	// drafted and accepted count this sequence's draft tokens and those that held.
	drafted, accepted int
}

const (
	draftDecay     = 0.7  // weight of the earlier counts at each draft token tried
	draftIdleDecay = 0.97 // and at each step without a draft
	draftPrior     = 0.1  // the prior's kept and missed tokens: a chance of one half
)

// chance is the estimated probability that a draft token holds, given the
// ones before it did.
func (d *draftState) chance() float64 {
	return (d.kept + draftPrior) / (d.kept + d.missed + 2*draftPrior)
}

// record updates the estimate with a draft of n tokens of which kept held.
func (d *draftState) record(n, kept int) {
	if n == 0 {
		d.kept *= draftIdleDecay
		d.missed *= draftIdleDecay
		return
	}
	d.drafted += n
	d.accepted += kept
	for range kept {
		d.kept = d.kept*draftDecay + 1
		d.missed *= draftDecay
	}
	if kept < n {
		d.kept *= draftDecay
		d.missed = d.missed*draftDecay + 1
	}
}

// checkDraft checks Config's draft settings.
func checkDraft(mode string, max int) error {
	switch mode {
	case DraftAuto, DraftNgram, DraftOff:
	default:
		return fmt.Errorf("draft: want auto, ngram or off, got %q", mode)
	}
	if max < 0 || max > 64 {
		return fmt.Errorf("draft max: want 0 to 64 tokens, got %d", max)
	}
	return nil
}
