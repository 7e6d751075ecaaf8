package llm

import "context"

// CommonPrefix is commonPrefix, for the package's external tests.
var CommonPrefix = commonPrefix

// TokenizeWhole tokenizes text in one llama.cpp call (what Tokenize does in
// chunks), for the tests that compare the two.
func (e *Engine) TokenizeWhole(text string, addSpecial bool) ([]int, error) {
	return e.be.Tokenize(text, addSpecial, true)
}

// TokenizeChunks is Tokenize (in chunks), with or without BOS.
func (e *Engine) TokenizeChunks(text string, addSpecial bool) ([]int, error) {
	return e.tokenize(context.Background(), text, addSpecial, true, 0)
}

// EmbedContext is what llama.cpp opened for an embedding engine: its
// context's tokens (n_ctx), its sequences (n_seq_max) and whether it keeps
// a KV cache.
func (e *Engine) EmbedContext() (nCtx, seqs int, kv bool) {
	return e.emb.be.contextShape()
}

// WithoutStateCopies makes cfg's backend refuse to copy a sequence's KV state
// out (StateSeqSave), as a backend with no state to give does: a sequence
// that steps out of its slot then evaluates its history again.
func WithoutStateCopies(cfg Config) Config {
	cfg.wrapBackend = func(be backend) backend { return noStateCopies{be} }
	return cfg
}

type noStateCopies struct{ backend }

func (noStateCopies) StateSeqSave(int) ([]byte, error) { return nil, errNoState }
