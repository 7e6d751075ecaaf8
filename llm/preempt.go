package llm

import (
	"slices"

	"go.uber.org/zap"
)

// preempt gives a waiting client with no slot one of the slots of the client
// holding the most (fairQueue.preemption), when every slot generates: one
// of that client's sequences steps out and goes back to the front of its
// client's queue, remembering its whole history (prompt and what it
// generated), and the newcomer's oldest sequence takes its place. Without
// it a newcomer waits for one of the other client's replies to end, however
// long (a heavy client's hundreds of tokens); with it, the heavy client's
// reply goes on where it stopped when a slot comes back. With more cache
// slots than generate at once (Config.CacheSlots) the newcomer takes a free
// one and the victim's slot keeps its cache: stepping out costs nothing.
// Otherwise the newcomer takes the victim's slot, and the victim's KV cache
// goes with it, copied out as llama.cpp's per-sequence state (swapOut), to
// be put back into whichever slot it gets next: a copy of its cache rather
// than its history evaluated again, which costs as many tokens as it held
// (measured with tools/fairbench, a heavy client's replies beside light
// users: 1.22 tokens decoded per token generated when the histories were
// evaluated again, 1.08 copied, 1.00 alone). At most maxSwapped states are held at once; past that, only a
// sequence whose history is one batch at most steps out, and it evaluates
// its history again. It returns the newcomer's sequence, popped, or nil
// when there is no such pair or none of the victim's sequences may step out
// (preemptible).
func (e *Engine) preempt() *sequence {
	newcomer, victim, ok := e.queue.preemption()
	if !ok {
		return nil
	}
	spare := false // a free slot: the newcomer takes it, the victim's cache stays
	for _, s := range e.slots {
		if s.seq == nil {
			spare = true
			break
		}
	}
	swap := !spare && e.swapped < e.maxSwapped()
	var out *sequence
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil || seq.client != victim || !e.preemptible(seq) {
			continue
		}
		if !spare && !swap && len(s.cached)+len(seq.pending) > e.batch {
			// Its slot goes to the newcomer and its history is evaluated
			// again: only a history of one batch at most, whose cost is
			// about one step's.
			continue
		}
		// The one with the least to evaluate again.
		if out == nil || len(s.cached)+len(seq.pending) < len(out.slot.cached)+len(out.pending) {
			out = seq
		}
	}
	if out == nil {
		return nil
	}
	s := out.slot
	if swap {
		e.swapOut(out)
	}
	out.resume = append(slices.Clip(slices.Clone(s.cached)), out.pending...)
	out.pending = nil
	out.iBatch = -1
	s.seq = nil
	s.tail = s.tail[:0]
	out.slot = nil
	e.busy.Add(-1)
	out.popped = false
	e.queued.Add(1)
	e.queue.requeue(out)
	e.preemptions.Add(1)
	e.log.Debug("slot preempted for a client without one", zap.Int("slot", s.id),
		zap.String("from", out.req.Key), zap.Int("history", len(out.resume)))
	return e.queue.popFrom(newcomer)
}

// lendable: a slot past its client's share may go to seq (fairQueue.lend),
// since seq could step out of it again for a copy of its KV state: it is of
// a kind that may step out (preemptible), and a state may be held.
func (e *Engine) lendable(seq *sequence) bool {
	return seq.gs == nil && seq.lazy == nil && e.dm == nil && seq.images == nil && e.swapped < e.maxSwapped()
}

// maxSwapped is how many stepped-out sequences may hold their KV state out
// of a slot at once (swapOut): as many as slots generate, so the states
// held take at most the slots' own KV memory again (host memory, on a GPU).
func (e *Engine) maxSwapped() int { return e.parallel }

// swapOut copies seq's KV cache out of its slot (llama.cpp's per-sequence
// state) before the slot goes to another sequence; swapIn puts it back. A
// failed copy leaves nothing held: the history is evaluated again.
func (e *Engine) swapOut(seq *sequence) {
	s := seq.slot
	state, err := e.be.StateSeqSave(s.id)
	if err != nil || len(state) == 0 {
		e.log.Debug("a stepped-out sequence's KV state could not be copied; its history is evaluated again",
			zap.Int("slot", s.id), zap.Error(err))
		return
	}
	seq.swapped = &swappedState{toks: slices.Clone(s.cached), state: state}
	e.swapped++
	e.swapOuts.Add(1)
}

// swapIn puts seq's state held by swapOut into slot s, when it holds more of
// the history toks than the slot keeps (keep tokens), and returns the tokens
// the slot now keeps. The state is dropped either way.
func (e *Engine) swapIn(s *slot, seq *sequence, toks []int, keep int) int {
	sw := e.dropSwapped(seq)
	if sw == nil || commonPrefix(sw.toks, toks) != len(sw.toks) || len(sw.toks) <= keep {
		return keep
	}
	if err := e.loadState(s, sw.state, sw.toks); err != nil {
		e.log.Warn("a stepped-out sequence's KV state did not load; its history is evaluated again",
			zap.Int("slot", s.id), zap.Error(err))
		return 0
	}
	e.swapIns.Add(1)
	return len(sw.toks)
}

// dropSwapped takes seq's state held by swapOut (nil when none).
func (e *Engine) dropSwapped(seq *sequence) *swappedState {
	sw := seq.swapped
	if sw != nil {
		seq.swapped = nil
		e.swapped--
	}
	return sw
}

// swappedState is a stepped-out sequence's KV cache, held out of any slot:
// the tokens it holds and llama.cpp's state of them.
type swappedState struct {
	toks  []int
	state []byte
}

// preemptible: seq can leave its slot between two steps and come back with
// its KV state copied back or its history evaluated again. Not a sequence
// whose grammar sampler works off the loop or whose reply may hand over to
// one (their samplers follow the steps), with an unverified draft, a draft
// model (its cache follows the slot) or images (evaluating an image again
// needs its encoder's output, which is not kept).
func (e *Engine) preemptible(seq *sequence) bool {
	return seq.gs == nil && seq.lazy == nil && !seq.unverified && e.dm == nil && seq.images == nil &&
		seq.ctx.Err() == nil && len(seq.pending) > 0
}
