package llm

import (
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
)

// draftModel is speculative decoding's second source of drafts: a small
// model of the same vocabulary, on the same engine, whose greedy
// continuation of a slot's history is that slot's draft. It has a context
// of its own with a sequence per slot (the same ids), and keeps in cached
// what each sequence's KV cache holds: before drafting, a sequence is
// brought to the slot's history by their common prefix (the rest leaves
// its KV cache: the draft tokens the target rejected, or an earlier
// conversation's), then the missing tokens are evaluated, then the draft
// is generated one token per decode. The target verifies the draft as it
// verifies one from the conversation (loop.go). Owned by the loop.
type draftModel struct {
	be     backend
	b      *batch
	cached [][]int // per slot id: the tokens in the draft model's KV cache
	// perToken is the recent time of one draft token's decode (a moving
	// average), which auto mode adds to the cost of each draft token.
	perToken time.Duration
	failed   bool // a decode failed: no more drafts from this model
}

// openDraftModel loads cfg.DraftModel on cfg's engine, for a target whose
// backend is target, and checks that its vocabulary is the target's: the
// same number of tokens, each with the same text and the same
// end-of-generation flag.
func openDraftModel(cfg Config, target backend, log *zap.Logger) (*draftModel, error) {
	meta, err := readMetadata(cfg.DraftModel)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	dc := cfg
	dc.Path, dc.DraftModel, dc.Draft, dc.Projector = cfg.DraftModel, "", DraftOff, ""
	dc.Engine = target.Name() // auto resolved: the target's
	dc.NoThreadPool = true    // its steps are short and interleave with the target's: no second pool of spinning threads
	dc.KVCache = KVCacheConfig{}
	be, _, err := openBackend(dc, meta, log)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	if err := sameVocab(target, be); err != nil {
		be.Close()
		return nil, fmt.Errorf("draft model %s: %w", cfg.DraftModel, err)
	}
	return &draftModel{be: be, b: newBatch(cfg.BatchSize), cached: make([][]int, cfg.CacheSlots)}, nil
}

// sameVocab reports how draft's vocabulary differs from target's, if it does.
func sameVocab(target, draft backend) error {
	if n, m := target.NumVocab(), draft.NumVocab(); n != m {
		return fmt.Errorf("its vocabulary has %d tokens, the model's %d: a draft model must share the model's vocabulary", m, n)
	}
	for tok := range target.NumVocab() {
		if a, b := target.TokenToPiece(tok), draft.TokenToPiece(tok); a != b {
			return fmt.Errorf("token %d is %q in it, %q in the model: a draft model must share the model's vocabulary", tok, b, a)
		}
		if target.TokenIsEog(tok) != draft.TokenIsEog(tok) {
			return fmt.Errorf("token %d (%q) ends generation in one model and not in the other", tok, target.TokenToPiece(tok))
		}
	}
	return nil
}

// propose appends to dst[:0] up to k tokens, the draft model's greedy
// continuation of hist (slot id's history, its last token the one the
// target decodes this step), and returns them: none when k < 1 or the
// model failed.
func (d *draftModel) propose(dst []int, id int, hist []int, k int, log *zap.Logger) []int {
	dst = dst[:0]
	if k < 1 || d.failed || len(hist) == 0 {
		return dst
	}
	have := d.cached[id]
	keep := commonPrefix(have, hist)
	if keep == len(hist) {
		keep-- // the last token's logits are needed again
	}
	if keep < len(have) {
		if !d.be.SeqRm(id, keep, -1) {
			d.be.SeqRm(id, 0, -1)
			keep = 0
		}
		have = have[:keep]
	}
	if slices.ContainsFunc(hist[keep:], func(t int) bool { return t < 0 }) {
		return dst // an image's positions: the draft model has no projector
	}
	// Evaluate the history the draft model's cache lacks, a batch at a time.
	for keep < len(hist) {
		d.b.clear()
		n := min(len(hist)-keep, d.b.size)
		for i := range n {
			d.b.add(hist[keep+i], keep+i, id, keep+i == len(hist)-1)
		}
		if err := d.be.Decode(d.b); err != nil {
			return d.fail(id, err, log)
		}
		have = append(have, hist[keep:keep+n]...)
		keep += n
	}
	row := d.b.numTokens() - 1
	for {
		tok := argmax(d.be.Logits(row))
		dst = append(dst, tok)
		if len(dst) == k || d.be.TokenIsEog(tok) {
			break
		}
		t0 := time.Now()
		d.b.clear()
		d.b.add(tok, len(have), id, true)
		if err := d.be.Decode(d.b); err != nil {
			d.cached[id] = have
			return d.fail(id, err, log)
		}
		d.observe(time.Since(t0))
		have = append(have, tok)
		row = 0
	}
	d.cached[id] = have
	return dst
}

// observe adds one draft token's decode time to perToken's average.
func (d *draftModel) observe(t time.Duration) {
	if d.perToken == 0 {
		d.perToken = t
		return
	}
	d.perToken += (t - d.perToken) / 8
}

// fail turns the draft model off after a failed decode: its cache state is
// unknown, and the target decodes on without drafts.
func (d *draftModel) fail(id int, err error, log *zap.Logger) []int {
	d.failed = true
	d.be.SeqRm(id, 0, -1)
	d.cached[id] = nil
	log.Error("draft model decode failed; speculative decoding from it is off", zap.Error(err))
	return nil
}

func (d *draftModel) close() { d.be.Close() }
