package llm

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// embedRow is one input in a batch: its call and its index there. The
// row's position in the step's list is its llama.cpp sequence id.
type embedRow struct {
	seq   *sequence
	input int
}

// embedLoop is an embedding engine's loop in place of loop: it owns the
// llama.cpp context and exits when Close is called. It holds up to
// Config.Parallel calls at once (popped from the fair queue, which caps one
// client's share) and packs each batch with their inputs round robin, one
// input of each call in turn, as many as fit the micro-batch and the
// context's sequences. An input never spans two batches: an encoder must
// see it whole, and pooling needs all of it.
func (e *Engine) embedLoop(b *batch) {
	defer close(e.done)
	var (
		active []*sequence
		rows   []embedRow
		turn   int
	)
	for {
		for len(active) < e.parallel {
			seq := e.queue.pop()
			if seq == nil && len(active) == 0 {
				select {
				case <-e.queue.signal:
					continue
				case <-e.closing:
					e.embedShutdown(active)
					return
				}
			}
			if seq == nil {
				break
			}
			seq.popped = true
			e.queued.Add(-1)
			if err := seq.ctx.Err(); err != nil {
				e.embedFinish(seq, err)
				continue
			}
			seq.started = time.Now()
			active = append(active, seq)
			e.busy.Add(1)
		}
		select {
		case <-e.closing:
			e.embedShutdown(active)
			return
		default:
		}
		// Calls whose client left end here, before their next batch.
		kept := active[:0]
		for _, seq := range active {
			if err := seq.ctx.Err(); err != nil {
				e.embedFinish(seq, err)
				continue
			}
			kept = append(kept, seq)
		}
		active = kept
		if len(active) == 0 {
			continue
		}

		rows = e.fillEmbedBatch(b, active, turn, rows[:0])
		turn++
		if len(rows) == 0 {
			// Cannot happen (Embed checks every input against the
			// micro-batch); without it the loop would spin.
			for _, seq := range active {
				e.embedFinish(seq, parley.Errorf(parley.EInternal, "an embedding input does not fit the batch"))
			}
			active = active[:0]
			continue
		}
		start := time.Now()
		err := e.emb.be.embedDecode(b)
		e.stepNanos.Add(int64(time.Since(start)))
		e.steps.Add(1)
		e.promptEval.Add(int64(b.numTokens()))
		for sid, r := range rows {
			job := r.seq.embed
			job.tokens += len(job.inputs[r.input])
			if err != nil {
				continue
			}
			v := e.emb.be.seqEmbedding(sid, e.emb.info.Dimensions)
			if v == nil {
				err = fmt.Errorf("llama.cpp gave no pooled output for sequence %d", sid)
				continue
			}
			job.out[r.input] = v
			job.done++
		}
		if err != nil {
			e.log.Error("embedding batch failed", zap.Error(err), zap.Int("tokens", b.numTokens()), zap.Int("inputs", len(rows)))
			failed := parley.Errorf(parley.EInternal, "the engine failed to evaluate an embedding batch")
			for _, r := range rows {
				e.embedFinish(r.seq, failed)
			}
		}
		kept = active[:0]
		for _, seq := range active {
			job := seq.embed
			switch {
			case job.answered: // failed above
			case job.done == len(job.inputs):
				e.embedFinish(seq, nil)
			default:
				kept = append(kept, seq)
			}
		}
		active = kept
	}
}

// fillEmbedBatch clears b and packs it with inputs of active, one of each
// call in turn starting from call turn%len(active), while they fit: at most
// e.batch tokens (one micro-batch) and e.emb.seqs inputs. An input too long
// for what is left is passed over for a shorter one of another call. It
// returns the rows, in sequence id order; at least one, since every input
// fits an empty batch (Embed checks MaxTokens).
func (e *Engine) fillEmbedBatch(b *batch, active []*sequence, turn int, rows []embedRow) []embedRow {
	b.clear()
	for added := true; added && len(rows) < e.emb.seqs; {
		added = false
		for k := range active {
			if len(rows) == e.emb.seqs {
				break
			}
			seq := active[(turn+k)%len(active)]
			job := seq.embed
			if job.next == len(job.inputs) {
				continue
			}
			in := job.inputs[job.next]
			if b.numTokens()+len(in) > e.batch {
				continue
			}
			sid := len(rows)
			for pos, tok := range in {
				b.add(tok, pos, sid, true)
			}
			rows = append(rows, embedRow{seq: seq, input: job.next})
			job.next++
			added = true
		}
	}
	return rows
}

// embedFinish answers a call (err nil: its outputs) and frees its share of
// the queue. A call is answered once; later calls do nothing.
func (e *Engine) embedFinish(seq *sequence, err error) {
	job := seq.embed
	if job.answered {
		return
	}
	job.answered = true
	if !seq.started.IsZero() {
		e.busy.Add(-1)
	}
	if seq.popped {
		seq.popped = false
		e.queue.done(seq)
	}
	r := embedResult{err: err}
	if err == nil {
		r.out = job.out
	}
	job.res <- r // 1-buffered, written once
}

// embedShutdown ends every call, held or queued, as the model closes.
func (e *Engine) embedShutdown(active []*sequence) {
	closing := parley.Errorf(parley.EUnavailable, "the model is shutting down")
	for _, seq := range active {
		e.embedFinish(seq, closing)
	}
	for _, seq := range e.queue.drain() {
		e.queued.Add(-1)
		e.embedFinish(seq, closing)
	}
}
