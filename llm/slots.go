package llm

import (
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// Thresholds for reusing a KV cache (see assign and copyPrefix).
const (
	// minReusePrefix is the shortest shared prefix for which a new sequence
	// prefers a slot over the least recently used one.
	minReusePrefix = 8

	// minCopyPrefixCPU and minCopyPrefixGPU are the fewest prompt tokens
	// more than its own slot holds that another slot must share with a
	// new sequence before the engine copies that slot's KV cache instead
	// of evaluating them (copyThreshold picks one by where the KV cache is,
	// and raises the CPU's where the copy costs more, below). On the CPU
	// (tools/decodebench -prefix-copy, synthetic 135M F16, 1 and 2 threads;
	// docs/notes/2026-11-27-shared-opening-and-peers.md) a copy
	// of 2,048-token slots costs 0-15 ms, what evaluating 0-7 prompt
	// tokens costs, so 8 tokens (a short system prompt, a shared question
	// opening) already pay there, while a BOS and a role marker stay below
	// it. On a GPU a prompt token costs a small fraction of a millisecond
	// against a device copy of the same order, so there it takes a longer
	// prefix (not measured).
	minCopyPrefixCPU = 8
	minCopyPrefixGPU = 32

	// copyFlopsPerBytePerThread is how much prompt evaluation one CPU
	// thread does in the time a copy of one byte of KV cache takes. The
	// copy is not of the shared tokens: with a KV stream per slot (the
	// default) llama.cpp copies the source slot's whole stream, --ctx
	// tokens of keys and values, in one thread (seq_cp across streams). Measured
	// with tools/decodebench -prefix-copy on a 135M F16 model trained for
	// 32,768 tokens: the copy took 8.5-11 ms at 2,048 tokens per slot,
	// 35-39 ms at 8,192 and 135-153 ms at 32,768 (about 5 GB/s), where
	// evaluating the 40 shared tokens took 88-100 ms (2 threads) and
	// 144-202 ms (1 thread): a prompt token's 2 x 107M FLOPs took 2.2-2.5
	// and 3.6-3.7 ms, so a thread does 8.5-12 FLOPs per byte copied.
	copyFlopsPerBytePerThread = 11
)

// copyThreshold is the engine's copy threshold (see the constants): on a
// GPU holding the whole KV cache, minCopyPrefixGPU; on the CPU,
// minCopyPrefixCPU, or more where the copy of a whole slot costs more than
// evaluating that many prompt tokens (large --ctx, a small model, several
// threads). A unified KV buffer copies no data (the cells gain the
// sequence). A model partly offloaded counts as on the CPU: the KV cache of
// the layers left there is copied on the CPU, and evaluating a prompt costs
// about those layers' CPU time, both in proportion to how many layers stayed,
// so the break-even is the CPU's (the GPU's layers, copied and evaluated on
// the device, add little to either side).
func copyThreshold(cfg Config, meta metadata, dev parley.Device) int {
	if dev.Type == "gpu" && dev.LayersOffloaded >= meta.info.Layers {
		return minCopyPrefixGPU
	}
	params := float64(meta.info.Parameters)
	if dev.KVUnified || params == 0 {
		return minCopyPrefixCPU
	}
	copyBytes := kvBytesPerToken(meta, cfg.KVCacheType) * float64(cfg.ContextLength)
	tokens := copyBytes * copyFlopsPerBytePerThread * float64(max(1, cfg.Threads)) / (2 * params)
	return max(minCopyPrefixCPU, int(math.Ceil(tokens)))
}

// slot is one llama.cpp sequence id and what its KV cache holds. Owned by the loop.
type slot struct {
	id       int
	key      string // key of the request that last used this slot
	cached   []int  // tokens whose keys and values are in the cache, in position order
	lastUsed uint64 // loop tick of the last assignment, for LRU
	seq      *sequence
	// tail is what the slot's last sequence generated after cached and
	// never decoded: its last token, when its reply ended on it (the length
	// limit, a cancel). The KV swap decodes it before it saves the slot's
	// state, so a saved state ends with the whole reply, as the next
	// prompt holds it. Reset when the slot is assigned.
	tail []int
	// scope is the cache scope of the request that last used this slot
	// (parley.CacheScope): only a request of the same scope reuses its
	// cache or copies it; any other finds the slot empty.
	scope string
	// stateless: the request that last used it belongs to no stored
	// conversation, so its state is kept in RAM only when the slot goes,
	// never at idle nor on disk (KV swap); ramDirty: it changed since.
	stateless, ramDirty bool
	// draft indexes the slot's history for drafts (draft.go): the prompt
	// of its sequence, then what it generated.
	draft *ngramIndex
	// finals are the final events of replies that left the slot, held
	// until its state is in the shared tier (KV swap: heldFinal).
	finals []heldFinal
}

// assign binds seq to a free slot: the one this key used last if it is free,
// else the least recently used; then trims the slot's cache to the longest
// common prefix with the prompt. A slot whose cache another scope filled
// counts as empty: it shares no prefix with seq, and its cache is dropped
// before seq uses it, so neither the cached-token count nor the time to the
// first token tells seq anything of another user's prompt.
func (e *Engine) assign(seq *sequence, tick uint64) {
	// The slot this key filled last wins. Otherwise the free slot sharing the
	// longest prefix with the prompt (a common system prompt, or a stateless
	// client resending a conversation), and among equals the least recently
	// used, so a new session takes over the slot least likely to be wanted back.
	toks, resumed := seq.req.Tokens, seq.resume != nil
	if resumed {
		toks = seq.resume // preempted (preempt.go): its history, its reply goes on
	}
	var best *slot
	bestPrefix := -2
	for _, s := range e.slots {
		if s.seq != nil {
			continue
		}
		if seq.req.Key != "" && s.key == seq.req.Key && s.scope == seq.scope {
			best = s
			break
		}
		p := 0
		if s.scope == seq.scope {
			p = commonPrefix(s.cached, toks)
		}
		if p < minReusePrefix {
			p = 0 // a BOS and a role marker in common is no reason to pass over the LRU slot
		}
		if s.key != "" && s.key != seq.req.Key && p < len(s.cached) {
			// Another conversation's slot that shares only an opening (a
			// system prompt) with this prompt: taking it would evict that
			// conversation, whose client is likely to come back, while
			// copyPrefix gives any other slot the opening at the cost of
			// a copy. Such slots are taken last, least recently used first.
			p = -1
		}
		if p > bestPrefix || (p == bestPrefix && s.lastUsed < best.lastUsed) {
			best, bestPrefix = s, p
		}
	}
	s := best
	e.kvTakeover(s, seq.req.Key) // KV swap: the state of the session leaving the slot
	s.tail = s.tail[:0]
	if s.key != seq.req.Key && s.key != "" {
		e.log.Debug("slot taken over", zap.Int("slot", s.id), zap.String("from", s.key), zap.String("to", seq.req.Key))
	}
	if s.scope != seq.scope && len(s.cached) > 0 {
		// Another scope's cache: nothing of it may serve seq (its state
		// was saved above, under its own key, when it had one).
		e.be.SeqRm(s.id, 0, -1)
		s.cached = s.cached[:0]
	}
	s.seq, s.key, s.lastUsed, s.scope, s.stateless = seq, seq.req.Key, tick, seq.scope, seq.stateless
	seq.slot = s
	if seq.started.IsZero() {
		seq.started = time.Now()
	}
	e.busy.Add(1)

	keep := commonPrefix(s.cached, toks)
	if resumed {
		keep = e.swapIn(s, seq, toks, keep) // its own state, copied out when it stepped out
	} else {
		keep = e.kvRestore(s, seq, keep) // KV swap: the session's saved state, when it holds more
	}
	e.copyPrefix(s, toks, keep)
	keep = commonPrefix(s.cached, toks)
	if keep == len(toks) {
		keep-- // at least one token must be decoded to get logits
	}
	keep = imageBoundary(toks, keep, seq.images)
	if keep < len(s.cached) {
		if !e.seqRmFrom(s, keep) {
			// Some memory types cannot drop a suffix: start over.
			e.be.SeqRm(s.id, 0, -1)
			keep = 0
		}
		s.cached = s.cached[:keep]
	}
	seq.pending = append([]int(nil), toks[keep:]...)
	if e.draftMode != DraftOff {
		s.draft.reset(toks)
	}
	if resumed {
		seq.resume = nil
		return // its usage and the prompt counters count its prompt once, as it was the first time
	}
	seq.usage.PromptTokens = len(toks)
	seq.usage.CachedPromptTokens = keep
	e.promptReused.Add(int64(keep))
	if len(seq.images) > 0 {
		e.imagesReused.Add(int64(imagesIn(toks[:keep], seq.images)))
	}
}

// imagesIn counts the image places in toks: the first pseudo id of each of runs' images (imageIDs).
func imagesIn(toks []int, runs map[int]*imageRun) int {
	n := 0
	for _, t := range toks {
		if t < 0 && runs[t] != nil {
			n++
		}
	}
	return n
}

// copyPrefix replaces the KV cache of s with another slot's when that slot
// (busy or not) of the same scope shares at least e.minCopy more leading
// tokens with toks than s's own cache does (keep): typically a system prompt
// common to many of a user's sessions, evaluated once instead of once per
// slot. Another scope's slot is never a source, whatever it holds. The other slot's
// cached tokens are all decoded (assign runs between steps), and the copy is
// done by llama.cpp before the next decode.
func (e *Engine) copyPrefix(s *slot, toks []int, keep int) {
	var src *slot
	best := keep
	for _, o := range e.slots {
		if o == s || o.scope != s.scope {
			continue
		}
		if p := commonPrefix(o.cached, toks); p > best {
			src, best = o, p
		}
	}
	if src == nil || best-keep < e.minCopy {
		return
	}
	// The slot's own cells go first: with one unified KV buffer a copy adds
	// this sequence to the source's cells, and llama.cpp aborts the process
	// on a cell that already holds it (one shared by an earlier copy).
	// Slots that are separate streams: llama.cpp copies only whole streams
	// (a partial range asserts), so copy all of it and drop the rest.
	e.be.SeqRm(s.id, 0, -1)
	e.be.SeqCp(src.id, s.id, 0, -1)
	s.cached = append(s.cached[:0], src.cached...)
	if best < len(s.cached) {
		if !e.seqRmFrom(s, best) {
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
