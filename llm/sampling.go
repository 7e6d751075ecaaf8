package llm

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// newSampler builds seq's sampler: an inline llama.cpp sampler without a
// grammar, or with one a grammarSampler whose goroutine has already checked
// (under the step budget) that some token can start the grammar.
// Params.Validate has checked the client's grammar or schema, and converted
// the schema: the grammar is taken from p as it recorded it, not converted
// again (Generate validates first, so p's record is current).
func (e *Engine) newSampler(p parley.Params, client string) (tokenSampler, *grammarSampler, error) {
	grammar, field, ok := p.CheckedGrammar() // field: what the client sent, for errors
	if !ok {
		return nil, nil, parley.Errorf(parley.EInternal, "sampling parameters were not validated")
	}
	sp := e.samplerParams(p)
	if grammar != "" {
		cg, err := e.compileGrammar(grammar, sp)
		if err != nil {
			return nil, nil, parley.FieldErrorf(field, "%v", err)
		}
		gs, err := e.startSampler(cg, field, client)
		if err != nil {
			return nil, nil, err
		}
		if err := e.probe(gs); err != nil {
			e.stopSampler(gs)
			return nil, nil, err
		}
		return nil, gs, nil
	}
	switch {
	case e.chainOnly:
	case plainGreedy(sp):
		return greedySampler{be: e.be}, nil, nil
	case prefilterable(sp, e.info.VocabSize):
		s, err := newPrefilterSampler(e.be, sp)
		if err != nil {
			return nil, nil, fmt.Errorf("sampler: %w", err)
		}
		return s, nil, nil
	}
	sc, err := e.be.NewSampler(sp)
	if err != nil {
		return nil, nil, fmt.Errorf("sampler: %w", err)
	}
	return sc, nil, nil
}

// samplerParams are p's sampling settings as llama.cpp's samplers take them:
// a negative seed is llama.cpp's random one, a negative repeat_last_n the
// whole context.
func (e *Engine) samplerParams(p parley.Params) samplerParams {
	seed := uint32(math.MaxUint32) // llama.cpp: random
	if p.Seed >= 0 {
		seed = uint32(p.Seed)
	}
	lastN := p.RepeatLastN
	if lastN < 0 {
		lastN = e.nCtx
	}
	return samplerParams{
		TopK:          p.TopK,
		TopP:          float32(p.TopP),
		MinP:          float32(p.MinP),
		TypicalP:      float32(p.TypicalP),
		Temp:          float32(p.Temperature),
		RepeatLastN:   lastN,
		PenaltyRepeat: float32(p.RepeatPenalty),
		PenaltyFreq:   float32(p.FrequencyPenalty),
		PenaltyPre:    float32(p.PresencePenalty),
		Seed:          seed,
	}
}

// probe checks, on gs's goroutine and within the step budget, that some
// token of the vocabulary can start the grammar: the first sample's work
// without its logits. A grammar that cannot even do that in time is
// refused (its sampler is abandoned and counted until llama.cpp returns).
func (e *Engine) probe(gs *grammarSampler) error {
	t0 := time.Now()
	gs.send(sampleJob{probe: true})
	t := time.NewTimer(e.budget)
	defer t.Stop()
	select {
	case r := <-gs.res:
		gs.inFlight = false
		if r.tok == sampleDeadEnd {
			return parley.FieldErrorf(gs.field, "no token of this model's vocabulary can start it")
		}
		// The answer may win the race with a timer that fired late (a
		// loaded machine): the time it took decides, not which came first.
		if time.Since(t0) > e.budget {
			return e.probeTooCostly(gs)
		}
		return nil
	case <-t.C:
		return e.probeTooCostly(gs)
	}
}

// probeTooCostly counts and explains a probe that took longer than the step budget.
func (e *Engine) probeTooCostly(gs *grammarSampler) error {
	e.overBudget.Add(1)
	return grammarError(gs.field, "is too costly to match: finding the tokens that can start it took longer than the %s step budget "+
		"(nested repetitions over overlapping characters multiply llama.cpp's work)", e.budget)
}

// sample draws seq's next tokens, inline, from the rows of the last step:
// its input's row, then, while each drawn token is the one its draft put
// there, the next draft token's row (emitRow). Each token is sent as it is
// drawn; the draft tokens that did not hold leave the KV cache after
// (settleDraft). It reports whether the sequence finished.
func (e *Engine) sample(seq *sequence) (finished bool) {
	s := seq.slot
	decoded := len(s.cached)
	s.cached = s.cached[:decoded-len(seq.draft)]
	seq.unverified = false
	for i := 0; ; i++ {
		idx := seq.iBatch + i
		t0 := time.Now()
		tok := seq.sampler.Sample(idx)
		seq.sampler.Accept(tok)
		if d := time.Since(t0); d > e.budget {
			finished = e.overStepBudget(seq, d)
			break
		}
		var logits []float32
		if !seq.req.Params.SkipLogprobs {
			logits = e.be.Logits(idx) // in place: emit uses it before the next decode
		}
		more, done := e.emitRow(seq, i, tok, logits)
		if done {
			finished = true
		}
		if !more {
			break
		}
	}
	seq.iBatch = -1
	e.settleDraft(seq, s, decoded)
	return finished
}

// took handles a grammar sampler's result for seq: the tokens it drew from
// the step's rows (as sample draws them inline), then the outcome of the
// last draw. It reports whether the sequence finished.
func (e *Engine) took(seq *sequence, r sampleResult) (finished bool) {
	s := seq.slot
	decoded := len(s.cached)
	s.cached = s.cached[:decoded-len(seq.draft)]
	seq.unverified = false
	nv := e.info.VocabSize
	for i, tok := range r.toks {
		var logits []float32
		if !seq.req.Params.SkipLogprobs && len(seq.logits) >= (i+1)*nv {
			logits = seq.logits[i*nv : (i+1)*nv]
		}
		more, done := e.emitRow(seq, i, tok, logits)
		if done {
			finished = true
		}
		if !more {
			break
		}
	}
	if !finished {
		switch r.tok {
		case sampleDeadEnd:
			e.deadEnds.Add(1)
			e.finish(seq, parley.FinishError, grammarError(seq.gs.field,
				"the grammar allows no token of this model's vocabulary after %d tokens", seq.generated))
			finished = true
		case sampleLostStep:
			e.deadEnds.Add(1)
			e.finish(seq, parley.FinishError, parley.Errorf(parley.EInternal, "the sampler chose no token the grammar allows"))
			finished = true
		}
	}
	e.settleDraft(seq, s, decoded)
	return finished
}

// overStepBudget ends seq, whose sampling step took d.
func (e *Engine) overStepBudget(seq *sequence, d time.Duration) bool {
	e.overBudget.Add(1)
	e.log.Warn("sequence over its step budget", zap.String("key", seq.req.Key),
		zap.Duration("step", d), zap.Duration("budget", e.budget))
	e.finish(seq, parley.FinishError, parley.Errorf(parley.EInternal,
		"generating a token took %s, over the %s budget (is the grammar too complex?)", d.Round(time.Millisecond), e.budget))
	return true
}
