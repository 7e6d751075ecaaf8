package llm

import (
	"fmt"
	"math"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// minPromptChunk is the least number of prompt tokens evaluated per step
// while other sequences are generating, so a long prompt makes progress
// without freezing their streams for long.
const minPromptChunk = 64

// imageWait bounds the loop's sleep while every active sequence waits for the image encoder. The encoder's result
// and a cancellation each wake the loop sooner; this only keeps a lost wake from stalling it for good.
const imageWait = time.Minute

// loop owns the llama.cpp context. It exits when Close is called.
func (e *Engine) loop(b *batch) {
	defer close(e.done)
	var tick uint64
	active := 0
	admit := func(seq *sequence) {
		seq.popped = true // it holds its client's share of the slots until finish
		e.queued.Add(-1)
		if seq.ctx.Err() != nil {
			e.finish(seq, parley.FinishCancelled, nil)
			return
		}
		e.assign(seq, tick)
		e.watchImageCancel(seq)
		active++
	}
	for {
		tick++
		// Admit queued requests into free slots, fairly between clients
		// (fairqueue.go). With nothing active, block.
		for active < e.parallel {
			seq := e.queue.pop()
			if seq == nil && active == 0 {
				// KV swap: nothing to decode, so keep what changed (unless a
				// request comes first).
				if seq = e.kvIdle(); seq == nil {
					select {
					case <-e.queue.signal:
						continue
					case <-e.closing:
						e.shutdown()
						return
					}
				}
			}
			if seq == nil {
				break
			}
			admit(seq)
		}
		for active >= e.parallel {
			// Every slot generates: a client without one may take one
			// from the client holding the most (preempt.go); every such
			// client at once, so that a burst of newcomers does not wait
			// a step for each one before it.
			seq := e.preempt()
			if seq == nil {
				break
			}
			active--
			admit(seq)
		}
		select {
		case <-e.closing:
			e.shutdown()
			return
		default:
		}

		done, next := e.collect()
		active -= done
		if done > 0 {
			e.kvSaveFinished() // KV swap with a shared tier: a turn's state leaves as it ends
		}
		if active > 0 && next > 0 {
			// Every active sequence waits for its grammar sampler: sleep
			// until one answers, its deadline passes or a request comes.
			var pushed <-chan struct{}
			if active < e.parallel {
				pushed = e.queue.signal // the loop's top admits it
			}
			t := time.NewTimer(next)
			select {
			case <-e.wake:
			case <-t.C:
			case <-pushed:
			case <-e.closing:
				t.Stop()
				e.shutdown()
				return
			}
			t.Stop()
			continue
		}
		if done := e.step(b); done > 0 {
			active -= done
			e.kvSaveFinished() // KV swap with a shared tier: a turn's state leaves as it ends
		}
	}
}

// collect takes the results of the grammar samplers that have one and ends
// the sequences whose sampler is past the step budget (their sampler is
// abandoned: it keeps its C memory until llama.cpp returns); it takes the
// image encoder's result and gives it its next image. It returns how many
// sequences finished and, when every active sequence is waiting for its
// sampler or for the encoder, how long until the first deadline (else 0).
func (e *Engine) collect() (finished int, next time.Duration) {
	waiting, ready := false, false
	now := time.Now()
	e.takeEncoded()
	e.feedEncoder()
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil {
			continue
		}
		if awaitsImage(seq) {
			// Waiting for the encoder, which wakes the loop when it is done, as a cancellation does
			// (watchImageCancel).
			if seq.ctx.Err() != nil {
				e.finish(seq, parley.FinishCancelled, nil)
				finished++
				continue
			}
			if !waiting || imageWait < next {
				next = imageWait
			}
			waiting = true
			continue
		}
		if seq.gs == nil || !seq.gs.inFlight {
			ready = true
			continue
		}
		select {
		case r := <-seq.gs.res:
			seq.gs.inFlight = false
			if e.took(seq, r) {
				finished++
			} else {
				ready = true
			}
			continue
		default:
		}
		if seq.ctx.Err() != nil {
			e.finish(seq, parley.FinishCancelled, nil)
			finished++
			continue
		}
		budget := e.budget * time.Duration(seq.gs.rows)
		if d := now.Sub(seq.gs.sentAt); d > budget {
			e.overBudget.Add(1)
			e.log.Warn("grammar sampler over its step budget", zap.String("key", seq.req.Key),
				zap.Duration("waited", d), zap.Duration("budget", budget))
			e.finish(seq, parley.FinishError, grammarError(seq.gs.field,
				"is too costly to match: choosing token %d took longer than the %s step budget "+
					"(nested repetitions over overlapping characters multiply llama.cpp's work); the reply was ended",
				seq.generated+1, e.budget))
			finished++
			continue
		}
		d := budget - now.Sub(seq.gs.sentAt) + time.Millisecond
		if !waiting || d < next {
			next = d
		}
		waiting = true
	}
	if ready || !waiting {
		return finished, 0
	}
	return finished, next
}

// step runs one decode step over every active sequence and returns how many
// sequences finished.
func (e *Engine) step(b *batch) (finished int) {
	capacity := b.size
	b.clear()

	// Cancelled sequences leave first, within one step of their cancellation.
	generating := 0
	for _, s := range e.slots {
		if s.seq == nil {
			continue
		}
		if s.seq.ctx.Err() != nil {
			e.finish(s.seq, parley.FinishCancelled, nil)
			finished++
			continue
		}
		if len(s.seq.pending) == 1 && s.seq.generated > 0 {
			generating++
		}
	}

	finished += e.stepImages()

	// Generating sequences get their one token each; prompts share what is
	// left, capped while others are generating so their streams keep flowing.
	promptBudget := capacity - generating
	if generating > 0 {
		promptBudget = min(promptBudget, max(minPromptChunk, e.batch/4))
	}
	inBatch := e.inBatch[:0]
	defer func() {
		clear(inBatch) // no sequence kept alive by the reused slice
		e.inBatch = inBatch[:0]
	}()
	// Drafts take what the inputs and the prompts leave of the batch.
	planned, left := generating, promptBudget
	seqs, minN, maxN := generating, 1, 1 // sequences in the step and their token counts, drafts aside
	for _, s := range e.slots {
		if seq := s.seq; seq != nil && !(len(seq.pending) == 1 && seq.generated > 0) {
			n := min(promptTokens(seq.pending), left)
			left -= n
			planned += n
			if n > 0 {
				if seqs == 0 {
					minN, maxN = n, n
				}
				seqs++
				minN, maxN = min(minN, n), max(maxN, n)
			}
		}
	}
	draftBudget := capacity - planned
	e.planDrafts(generating, planned, draftBudget, e.shape(seqs, minN, maxN), seqs)
	shapeSeqs, shapeMin, shapeMax := seqs, minN, maxN // and with drafts, as the batch is built
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil {
			continue
		}
		n := len(seq.pending)
		gen := n == 1 && seq.generated > 0
		if !gen {
			n = min(promptTokens(seq.pending), promptBudget)
			promptBudget -= n
		}
		if n == 0 {
			continue
		}
		pos := e.posAt(s.cached, len(s.cached))
		for i := range n {
			last := i == n-1 && n == len(seq.pending)
			b.add(seq.pending[i], pos+i, s.id, last)
			if last {
				seq.iBatch = b.numTokens() - 1
			}
		}
		s.cached = append(s.cached, seq.pending[:n]...)
		if seq.generated == 0 {
			e.promptEval.Add(int64(n))
		}
		seq.pending = seq.pending[n:]
		seq.draft = seq.draft[:0]
		if gen {
			d := e.addDraft(b, seq, generating, capacity-draftBudget, draftBudget)
			draftBudget -= d
			shapeMin, shapeMax = min(shapeMin, 1+d), max(shapeMax, 1+d)
		}
		inBatch = append(inBatch, seq)
	}
	if b.numTokens() == 0 {
		return finished
	}

	t0 := time.Now()
	err := e.be.Decode(b)
	took := time.Since(t0)
	e.steps.Add(1)
	e.stepNanos.Add(int64(took))
	e.decoded.Add(int64(b.numTokens()))
	if err != nil {
		e.log.Error("decode failed", zap.Error(err), zap.Int("batch_tokens", b.numTokens()))
		for _, seq := range inBatch {
			// The cache state of these slots is unknown now: forget it,
			// the draft's tokens with the rest (the slot's n-gram index
			// starts again when its next sequence takes it).
			e.be.SeqRm(seq.slot.id, 0, -1)
			seq.slot.cached = seq.slot.cached[:0]
			seq.draft, seq.unverified = seq.draft[:0], false
			e.finish(seq, parley.FinishError, fmt.Errorf("decode: %w", err))
			finished++
		}
		return finished
	}
	if e.draftMode == DraftAuto {
		e.costs.observe(e.shape(shapeSeqs, shapeMin, shapeMax), b.numTokens(), took)
	}
	if e.onDrafted != nil {
		for _, seq := range inBatch {
			if len(seq.draft) > 0 {
				e.onDrafted(seq.ctx)
			}
		}
	}

	for _, seq := range inBatch {
		if seq.iBatch < 0 {
			continue // more prompt to evaluate
		}
		if seq.gs != nil {
			// Off the loop: the sampler gets its own copy of the logits
			// (the next decode overwrites llama.cpp's), and the sequence
			// sits out of the batch until its tokens come back.
			rows := 1 + len(seq.draft)
			seq.logits = seq.logits[:0]
			for i := range rows {
				seq.logits = append(seq.logits, e.be.Logits(seq.iBatch+i)...)
			}
			seq.iBatch = -1
			seq.gs.send(sampleJob{logits: seq.logits, rows: rows, draft: seq.draft})
			continue
		}
		if done := e.sample(seq); done {
			finished++
		}
	}
	return finished
}

// addDraft appends seq's draft for this step to b, after the token it
// just added, and returns its length. A draft is what followed the latest
// earlier occurrence of the history's end (draft.go), at most the longest
// draft, what is left of the batch (budget), what the reply may still
// generate and what the slot's context holds; in auto mode it is also at
// most the step's plan for seq (planDrafts), or, in a step without one,
// each token must be likely enough to hold that the step's time it costs
// pays (draftCost.bar, for an even step of n tokens of which g generate).
func (e *Engine) addDraft(b *batch, seq *sequence, g, n, budget int) int {
	if e.draftMode == DraftOff || e.noDraft {
		return 0
	}
	s := seq.slot
	k := min(e.draftMax, budget, seq.req.Params.MaxTokens-seq.generated-1, e.nCtx-2-len(s.cached))
	if e.draftMode == DraftAuto && seq.plan >= 0 {
		k = min(k, seq.plan)
	} else if e.draftMode == DraftAuto && k > 0 {
		// The i-th token holds with chance^i (all before it must); it
		// goes in while that clears the bar of the step it lengthens.
		p, c := seq.ds.chance(), 1.0
		limit := 0
		var extra time.Duration // the draft model's time per draft token
		if e.dm != nil {
			extra = e.dm.perToken
		}
		for limit < k {
			c *= p
			if c <= e.costs.by[shapeEven].barWith(g, n+limit+1, extra) {
				break
			}
			limit++
		}
		k = limit
	}
	if k <= 0 {
		seq.ds.record(0, 0)
		return 0
	}
	if e.dm != nil {
		e.draftBuf = e.dm.propose(e.draftBuf, s.id, s.cached, k, e.log)
	} else {
		e.draftBuf = s.draft.lookup(e.draftBuf, k)
	}
	if len(e.draftBuf) == 0 {
		seq.ds.record(0, 0)
		return 0
	}
	pos := e.posAt(s.cached, len(s.cached))
	for i, tok := range e.draftBuf {
		b.add(tok, pos+i, s.id, true)
	}
	s.cached = append(s.cached, e.draftBuf...)
	seq.draft = append(seq.draft, e.draftBuf...)
	seq.unverified = true
	e.drafted.Add(int64(len(seq.draft)))
	seq.drafted += len(seq.draft)
	return len(seq.draft)
}

// emitRow emits tok, drawn from row i of seq's last step (its input's row,
// then one per draft token), with that row's logits (nil when not wanted).
// It reports whether the next row is to be drawn too: tok is the draft's
// token i, which the step decoded already, and the sequence goes on with
// the same sampler (not one a tool call's trigger just handed to its
// grammar). Otherwise tok is the next step's input and the rows after it
// are not drawn.
func (e *Engine) emitRow(seq *sequence, i, tok int, logits []float32) (more, finished bool) {
	s := seq.slot
	inline := seq.gs == nil
	if e.emit(seq, tok, logits) {
		return false, true
	}
	if i < len(seq.draft) && tok == seq.draft[i] && (seq.gs == nil) == inline {
		seq.accepted++
		s.cached = append(s.cached, tok)
		seq.pending = seq.pending[:0]
		return true, false
	}
	return false, false
}

// dropDraft removes seq's unverified draft from its slot s.
func (e *Engine) dropDraft(seq *sequence, s *slot) {
	seq.unverified = false
	keep := max(0, len(s.cached)-len(seq.draft))
	seq.draft = seq.draft[:0]
	if !e.seqRmFrom(s, keep) {
		e.be.SeqRm(s.id, 0, -1)
		keep = 0
	}
	s.cached = s.cached[:keep]
	s.draft.truncate(keep)
}

// settleDraft ends a step's verification for seq, which ran in slot s:
// the draft tokens that did not hold (those past s.cached, which emitRow
// extended as they held) leave the KV cache, the slot's history follows,
// and seq's estimate learns how many held. decoded is how many tokens the
// slot held after the step's decode.
func (e *Engine) settleDraft(seq *sequence, s *slot, decoded int) {
	n := len(seq.draft)
	if n == 0 {
		return
	}
	held := len(s.cached) - (decoded - n)
	seq.ds.record(n, held)
	e.draftHeld.Add(int64(held))
	seq.draft = seq.draft[:0]
	s.draft.truncate(len(s.cached) + len(seq.pending))
	if len(s.cached) == decoded {
		return
	}
	if e.seqRmFrom(s, len(s.cached)) {
		return
	}
	// This memory cannot drop a suffix (a recurrent model's): no more
	// drafts; the slot starts over, and a sequence still running evaluates
	// its whole history again.
	e.noDraft = true
	e.log.Warn("speculative decoding is off: the model's KV cache cannot drop rejected draft tokens")
	e.be.SeqRm(s.id, 0, -1)
	s.cached = s.cached[:0]
	s.tail = s.tail[:0]
	if seq.slot == s {
		seq.pending = slices.Clone(s.draft.toks)
	}
}

// emit sends tok and decides whether seq is done; logits (nil when not
// wanted) are the raw logits it was drawn from, for its logprob. It
// reports whether the sequence finished.
func (e *Engine) emit(seq *sequence, tok int, logits []float32) bool {
	if e.be.TokenIsEog(tok) {
		e.finish(seq, parley.FinishEOS, nil)
		return true
	}
	if seq.generated == 0 {
		seq.firstTok = time.Now()
	}
	seq.generated++
	e.generated.Add(1)

	lp := math.NaN()
	if !seq.req.Params.SkipLogprobs && logits != nil {
		lp = logprob(logits, tok, seq.temp)
	}
	ev := parley.Event{Token: parley.Token{
		ID:      tok,
		Text:    e.TokenText(tok),
		Logprob: lp,
		Special: e.vocab.special(tok),
	}}
	if len(seq.out) >= cap(seq.out)-1 {
		// The consumer is maxEventBuffer events behind: it is not reading.
		e.slowDrops.Add(1)
		e.finish(seq, parley.FinishError, parley.Errorf(parley.EInternal, "the client stopped reading the reply"))
		return true
	}
	seq.out <- ev
	if e.draftMode != DraftOff {
		seq.slot.draft.push(tok)
	}

	// The token is the next step's input, or, when the sequence ends here,
	// the slot's tail (see finish).
	seq.pending = append(seq.pending[:0], tok)
	switch {
	case seq.generated >= seq.req.Params.MaxTokens:
		e.finish(seq, parley.FinishLength, nil)
		return true
	case len(seq.slot.cached)+1 > e.nCtx-1:
		// The next token would need the last free position: stop before the context is full.
		e.finish(seq, parley.FinishLength, nil)
		return true
	}
	if seq.lazy != nil {
		e.watchTrigger(seq, ev.Token.Text)
	}
	return false
}

// finish ends seq: frees its slot (keeping the cached tokens for reuse) and
// sends the final event, for which the channel always has room.
func (e *Engine) finish(seq *sequence, reason parley.FinishReason, err error) {
	e.dropSwapped(seq) // ended while it waited to come back
	if seq.gs != nil {
		e.stopSampler(seq.gs)
	}
	if seq.lazy != nil {
		e.stopSampler(seq.lazy.gs)
		seq.lazy = nil
	}
	var hold *slot // KV swap: the slot whose state the final event waits for
	if s := seq.slot; s != nil {
		if seq.unverified {
			// Ended while its sampler was verifying a draft (cancelled,
			// over the budget, the engine closing): the draft leaves the
			// KV cache unverified.
			e.dropDraft(seq, s)
		}
		s.seq = nil
		seq.slot = nil
		e.busy.Add(-1)
		// A reply that ended on a token it generated (not an end of text,
		// which emit does not keep): the token was sampled, never decoded.
		s.tail = s.tail[:0]
		if seq.generated > 0 && reason != parley.FinishError {
			s.tail = append(s.tail, seq.pending...)
		}
		if e.kvHoldsFinal(s) {
			hold = s
		}
	}
	if seq.popped {
		seq.popped = false
		e.queue.done(seq)
	}
	if seq.unwatch != nil {
		seq.unwatch()
		seq.unwatch = nil
	}
	releaseRuns(seq.images)
	seq.images = nil
	now := time.Now()
	seq.usage.CompletionTokens = seq.generated
	final := parley.Event{Done: true, Finish: reason, Usage: seq.usage, Err: err}
	final.Timings.Total = now.Sub(seq.submitted)
	if !seq.started.IsZero() {
		final.Timings.Queued = seq.started.Sub(seq.submitted)
	}
	if !seq.firstTok.IsZero() {
		final.Timings.TimeToFirstToken = seq.firstTok.Sub(seq.submitted)
	}
	final.Timings.Drafted, final.Timings.DraftAccepted = seq.drafted, seq.accepted
	if hold != nil {
		// Sent by the slot's next save, once the state is in the shared
		// tier (kvSaveFinished, after this step).
		hold.finals = append(hold.finals, heldFinal{seq.out, final, now})
		return
	}
	seq.out <- final
	close(seq.out)
}

// shutdown ends every active and queued sequence as cancelled. Called by the loop.
func (e *Engine) shutdown() {
	for _, s := range e.slots {
		if s.seq != nil {
			e.finish(s.seq, parley.FinishCancelled, nil)
		}
	}
	e.kvSaveIdle(nil) // KV swap: a restart finds every conversation warm
	for _, seq := range e.queue.drain() {
		e.queued.Add(-1)
		e.finish(seq, parley.FinishCancelled, nil)
	}
	e.stopEncoder()
}
