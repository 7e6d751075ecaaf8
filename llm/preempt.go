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
// Otherwise the newcomer takes the victim's slot, and the victim evaluates
// its history again when it is back: so only a sequence whose history is
// one batch at most steps out. It returns the newcomer's sequence, popped,
// or nil when there is no such pair or none of the victim's sequences may
// step out (preemptible).
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
	var out *sequence
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil || seq.client != victim || !e.preemptible(seq) {
			continue
		}
		if !spare && len(s.cached)+len(seq.pending) > e.batch {
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

// preemptible: seq can leave its slot between two steps and come back by
// evaluating its history again. Not a sequence whose grammar sampler works
// off the loop or whose reply may hand over to one (their samplers follow
// the steps), with an unverified draft, a draft model (its cache follows
// the slot) or images (their positions are not tokens).
func (e *Engine) preemptible(seq *sequence) bool {
	return seq.gs == nil && seq.lazy == nil && !seq.unverified && e.dm == nil && seq.images == nil &&
		seq.ctx.Err() == nil && len(seq.pending) > 0
}
