package llm

import (
	"time"

	"go.uber.org/zap"
)

// Thresholds for reusing a KV cache (see assign and copyPrefix).
const (
	// minReusePrefix is the shortest shared prefix for which a new sequence
	// prefers a slot over the least recently used one.
	minReusePrefix = 8

	// minCopyPrefix is how many more prompt tokens another slot must share
	// with a new sequence than its own slot does before the engine copies
	// that slot's KV cache instead of evaluating them. Each slot is its own
	// llama.cpp stream, so a copy moves the whole stream's buffer (a few
	// milliseconds): worth it for a system prompt, not for a BOS and a role
	// marker.
	minCopyPrefix = 32
)

// slot is one llama.cpp sequence id and what its KV cache holds. Owned by the loop.
type slot struct {
	id       int
	key      string // key of the request that last used this slot
	cached   []int  // tokens whose keys and values are in the cache, in position order
	lastUsed uint64 // loop tick of the last assignment, for LRU
	seq      *sequence
}

// assign binds seq to a free slot: the one this key used last if it is free,
// else the least recently used; then trims the slot's cache to the longest
// common prefix with the prompt.
func (e *Engine) assign(seq *sequence, tick uint64) {
	// The slot this key filled last wins. Otherwise the free slot sharing the
	// longest prefix with the prompt (a common system prompt, or a stateless
	// client resending a conversation), and among equals the least recently
	// used, so a new session takes over the slot least likely to be wanted back.
	// A keyed request does not choose by prefix a slot that another key's
	// conversation holds more of: it would evict that conversation for a
	// prefix copyPrefix gives it anyway (from any slot), and with more
	// conversations than slots decoding at once (Config.CacheSlots) the
	// least recently used slot is usually one nobody wants back.
	var best *slot
	bestPrefix := -1
	for _, s := range e.slots {
		if s.seq != nil {
			continue
		}
		if seq.req.Key != "" && s.key == seq.req.Key {
			best = s
			break
		}
		p := commonPrefix(s.cached, seq.req.Tokens)
		if p < minReusePrefix || (seq.req.Key != "" && s.key != "" && p < len(s.cached)) {
			p = 0 // a BOS and a role marker in common is no reason to pass over the LRU slot
		}
		if p > bestPrefix || (p == bestPrefix && s.lastUsed < best.lastUsed) {
			best, bestPrefix = s, p
		}
	}
	s := best
	if s.key != seq.req.Key && s.key != "" {
		e.log.Debug("slot taken over", zap.Int("slot", s.id), zap.String("from", s.key), zap.String("to", seq.req.Key))
	}
	s.seq, s.key, s.lastUsed = seq, seq.req.Key, tick
	seq.slot = s
	seq.started = time.Now()
	e.busy.Add(1)

	toks := seq.req.Tokens
	keep := commonPrefix(s.cached, toks)
	e.copyPrefix(s, toks, keep)
	keep = commonPrefix(s.cached, toks)
	if keep == len(toks) {
		keep-- // at least one token must be decoded to get logits
	}
	if keep < len(s.cached) {
		if !e.be.SeqRm(s.id, keep, -1) {
			// Some memory types cannot drop a suffix: start over.
			e.be.SeqRm(s.id, 0, -1)
			keep = 0
		}
		s.cached = s.cached[:keep]
	}
	seq.pending = append([]int(nil), toks[keep:]...)
	seq.usage.PromptTokens = len(toks)
	seq.usage.CachedPromptTokens = keep
	e.promptReused.Add(int64(keep))
}

// copyPrefix replaces the KV cache of s with another slot's when that slot
// (busy or not) shares at least minCopyPrefix more leading tokens with toks
// than s's own cache does (keep): typically a system prompt common to many
// sessions, evaluated once instead of once per slot. The other slot's
// cached tokens are all decoded (assign runs between steps), and the copy is
// done by llama.cpp before the next decode.
func (e *Engine) copyPrefix(s *slot, toks []int, keep int) {
	var src *slot
	best := keep
	for _, o := range e.slots {
		if o == s {
			continue
		}
		if p := commonPrefix(o.cached, toks); p > best {
			src, best = o, p
		}
	}
	if src == nil || best-keep < minCopyPrefix {
		return
	}
	// Slots are separate streams: llama.cpp copies only whole streams
	// (a partial range asserts), so copy all of it and drop the rest.
	e.be.SeqCp(src.id, s.id, 0, -1)
	s.cached = append(s.cached[:0], src.cached...)
	if best < len(s.cached) {
		if !e.be.SeqRm(s.id, best, -1) {
			e.be.SeqRm(s.id, 0, -1)
			s.cached = s.cached[:0]
			return
		}
		s.cached = s.cached[:best]
	}
	e.prefixCopies.Add(1)
	e.promptCopied.Add(int64(best - keep))
	e.log.Debug("prompt prefix copied from another slot", zap.Int("from", src.id), zap.Int("to", s.id), zap.Int("tokens", best))
}

func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
