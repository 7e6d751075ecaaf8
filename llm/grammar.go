package llm

import (
	"errors"
	"math"
	"strings"

	"github.com/ollama/ollama/llama"
)

// grammarVocab is the vocabulary as the grammar checker needs it, built once.
type grammarVocab struct {
	ids    []uint32
	pieces []string
	eog    []int32
}

func (e *Engine) grammarVocab() *grammarVocab {
	e.gvOnce.Do(func() {
		n := e.info.VocabSize
		// The token texts are the table Open built: the same the sampler's
		// and the guard's grammars match.
		gv := &grammarVocab{ids: make([]uint32, n), pieces: e.pieces}
		for i := range n {
			gv.ids[i] = uint32(i)
			if e.model.TokenIsEog(i) {
				gv.eog = append(gv.eog, int32(i))
			}
		}
		e.gv = gv
	})
	return e.gv
}

// checkGrammar parses a GBNF grammar with llama.cpp's parser inside a
// try/catch and checks that some token can start it. llama.cpp's sampler
// does neither safely: a grammar that fails to parse becomes a null sampler
// (a crash on first use), and "%llguidance" grammars abort the process.
// The compiled grammar is returned to serve as the sequence's guard (see
// grammarAllowsAny); the caller frees it.
func (e *Engine) checkGrammar(grammar string) (*llama.Grammar, error) {
	if strings.HasPrefix(strings.TrimSpace(grammar), "%llguidance") {
		return nil, errors.New("llguidance grammars are not supported")
	}
	if strings.IndexByte(grammar, 0) >= 0 {
		return nil, errors.New("must not contain NUL bytes")
	}
	gv := e.grammarVocab()
	g := llama.NewGrammar(grammar, gv.ids, gv.pieces, gv.eog)
	if g == nil {
		return nil, errors.New("does not parse as GBNF with a root rule (or is left-recursive)")
	}
	if allowsAny(g, make([]llama.TokenData, len(gv.ids))) {
		return g, nil
	}
	g.Free()
	return nil, errors.New("no token of this model's vocabulary can start it")
}

// grammarAllowsAny reports whether seq's grammar, in its current state,
// allows at least one token. Called by the loop before sampling.
func (e *Engine) grammarAllowsAny(seq *sequence) bool {
	if seq.cands == nil {
		seq.cands = make([]llama.TokenData, e.info.VocabSize)
	}
	return allowsAny(seq.guard, seq.cands)
}

// allowsAny fills cands with every token of the vocabulary, lets g mask
// them (Apply filters; the grammar's state is unchanged) and reports
// whether one is left.
func allowsAny(g *llama.Grammar, cands []llama.TokenData) bool {
	for i := range cands {
		cands[i] = llama.TokenData{ID: int32(i)}
	}
	g.Apply(cands)
	for _, c := range cands {
		if !math.IsInf(float64(c.Logit), -1) {
			return true
		}
	}
	return false
}
