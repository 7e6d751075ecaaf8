package llm

/*
#include <stdbool.h>
#include <stdint.h>
// As in llama.h (not included: its include path belongs to the binding).
struct llama_context;
struct llama_model;
struct llama_vocab;
extern int llama_pooling_type(const struct llama_context *ctx);
extern const struct llama_model *llama_get_model(const struct llama_context *ctx);
extern const struct llama_vocab *llama_model_get_vocab(const struct llama_model *model);
extern int32_t llama_model_n_embd(const struct llama_model *model);
extern uint32_t llama_model_n_cls_out(const struct llama_model *model);
extern uint32_t llama_n_ctx(const struct llama_context *ctx);
extern uint32_t llama_n_seq_max(const struct llama_context *ctx);
struct llama_memory_i;
extern struct llama_memory_i *llama_get_memory(const struct llama_context *ctx);
extern float *llama_get_embeddings_seq(struct llama_context *ctx, int32_t seq_id);
extern int32_t llama_vocab_bos(const struct llama_vocab *vocab);
extern int32_t llama_vocab_eos(const struct llama_vocab *vocab);
extern int32_t llama_vocab_sep(const struct llama_vocab *vocab);
extern bool llama_vocab_get_add_bos(const struct llama_vocab *vocab);
extern bool llama_vocab_get_add_eos(const struct llama_vocab *vocab);
extern bool llama_vocab_get_add_sep(const struct llama_vocab *vocab);
*/
import "C"

import (
	"unsafe"
)

// The embedded engine's side of embeddings (embed.go). The binding's
// GetEmbeddingsSeq copies n_embd values, more than a reranker's output
// holds (n_cls_out), so the pooled output is read here through the context
// pointer the binding hides (contextPointer, as state.go does).

var _ embedBackend = (*embedded)(nil)

// embedShape reports no pooling when the binding's context is not the
// mirrored one: Open then refuses the model rather than guess.
func (be *embedded) embedShape() (pooling, n int) {
	c := be.logits.c
	if c == nil {
		return poolingNone, 0
	}
	pooling = int(C.llama_pooling_type(c))
	m := C.llama_get_model(c)
	if pooling == poolingRank {
		return pooling, int(C.llama_model_n_cls_out(m))
	}
	return pooling, int(C.llama_model_n_embd(m))
}

func (be *embedded) specialTokens() specialTokens {
	c := be.logits.c
	if c == nil {
		return specialTokens{bos: -1, eos: -1, sep: -1}
	}
	v := C.llama_model_get_vocab(C.llama_get_model(c))
	return specialTokens{
		bos: int(C.llama_vocab_bos(v)), eos: int(C.llama_vocab_eos(v)), sep: int(C.llama_vocab_sep(v)),
		addBOS: bool(C.llama_vocab_get_add_bos(v)), addEOS: bool(C.llama_vocab_get_add_eos(v)), addSEP: bool(C.llama_vocab_get_add_sep(v)),
	}
}

func (be *embedded) embedDecode(b *batch) error {
	be.lc.KvCacheClear() // a no-op for an encoder, which has no KV cache
	return be.Decode(b)
}

func (be *embedded) contextShape() (nCtx, seqs int, kv bool) {
	c := be.logits.c
	if c == nil {
		return 0, 0, false
	}
	return int(C.llama_n_ctx(c)), int(C.llama_n_seq_max(c)), C.llama_get_memory(c) != nil
}

func (be *embedded) seqEmbedding(seq, n int) []float32 {
	c := be.logits.c
	if c == nil {
		return nil
	}
	p := C.llama_get_embeddings_seq(c, C.int32_t(seq))
	if p == nil {
		return nil
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), n)...)
}
