package llm

import (
	"fmt"

	yz "github.com/hybridgroup/yzma/pkg/llama"
)

// The current engine's side of embeddings (embed.go).

var _ embedBackend = (*current)(nil)

func (be *current) embedShape() (pooling, n int) {
	pooling = int(yz.GetPoolingType(be.lc))
	if pooling == poolingRank {
		return pooling, int(yz.ModelNClsOut(be.model))
	}
	return pooling, int(yz.ModelNEmbdOut(be.model))
}

func (be *current) specialTokens() specialTokens {
	id := func(t yz.Token) int {
		if t < 0 {
			return -1
		}
		return int(t)
	}
	return specialTokens{
		bos: id(yz.VocabBOS(be.vocab)), eos: id(yz.VocabEOS(be.vocab)), sep: id(yz.VocabSEP(be.vocab)),
		addBOS: yz.VocabGetAddBOS(be.vocab), addEOS: yz.VocabGetAddEOS(be.vocab), addSEP: yz.VocabGetAddSEP(be.vocab),
	}
}

func (be *current) embedDecode(b *batch) error {
	if be.mem != 0 {
		// A causal model keeps a KV cache: every batch starts its inputs
		// at position 0.
		if err := yz.MemoryClear(be.mem, true); err != nil {
			return fmt.Errorf("clear the KV cache: %w", err)
		}
	}
	return be.Decode(b)
}

func (be *current) contextShape() (nCtx, seqs int, kv bool) {
	return int(yz.NCtx(be.lc)), int(yz.NSeqMax(be.lc)), be.mem != 0
}

func (be *current) seqEmbedding(seq, n int) []float32 {
	v, err := yz.GetEmbeddingsSeq(be.lc, yz.SeqId(seq), int32(n))
	if err != nil || v == nil {
		return nil
	}
	return append([]float32(nil), v...) // the view is valid until the next decode
}
