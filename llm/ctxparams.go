package llm

/*
#include <stdbool.h>
#include <stdint.h>
// A mirror of llama.h's struct llama_context_params at the pinned llama.cpp
// (llama.h is not included here: its include path belongs to the binding).
// The binding's NewContextParams sets neither kv_unified nor embeddings the
// way a server of many sessions on a GPU wants, and exposes no setter.
// tuneContextParams checks the mirror against the binding's own struct (its
// size and every field NewContextParams set) before writing through it, and
// leaves the parameters alone on any mismatch. Enums are C ints.
struct parley_context_params {
	uint32_t n_ctx, n_batch, n_ubatch, n_seq_max;
	int32_t  n_threads, n_threads_batch;
	int      rope_scaling_type, pooling_type, attention_type, flash_attn_type;
	float    rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
	uint32_t yarn_orig_ctx;
	float    defrag_thold;
	void    *cb_eval, *cb_eval_user_data;
	int      type_k, type_v;
	void    *abort_callback, *abort_callback_data;
	bool     embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
};
*/
import "C"

import (
	"unsafe"

	"github.com/ollama/ollama/llama"
)

// contextShape is what Open passed to llama.NewContextParams, to recognise
// the struct behind the binding's type.
type contextShape struct {
	nCtx, batch, parallel, threads int
}

// tuneContextParams sets two fields the binding leaves at values a chat
// server does not want, and reports whether it could (false: the binding's
// struct is not the one mirrored above, and p is unchanged):
//
//   - embeddings off: the binding turns them on (for its embedding
//     endpoint), which copies every output token's hidden state back from
//     the device at each decode; Parley reads only logits.
//   - kv_unified, when asked for (Config.KVUnified): one KV buffer shared
//     by all slots instead of one stream per slot. With streams, llama.cpp
//     splits a batch into micro-batches of equal tokens per sequence and
//     consecutive sequence ids only, so a step whose busy slots have gaps
//     or mixes a prompt with single generated tokens becomes several passes
//     over the weights; shared, any batch up to the micro-batch size is one
//     pass, but each token attends over the whole buffer (masked to its own
//     sequence). On an H100 at 64 sessions the second cost won (3,094 tok/s
//     shared against 5,196 with streams), hence off by default.
func tuneContextParams(p *llama.ContextParams, s contextShape, unified bool) bool {
	if unsafe.Sizeof(*p) != C.sizeof_struct_parley_context_params {
		return false
	}
	c := (*C.struct_parley_context_params)(unsafe.Pointer(p))
	if int(c.n_ctx) != s.nCtx || int(c.n_ubatch) != s.batch || int(c.n_batch) != s.batch*s.parallel ||
		int(c.n_seq_max) != s.parallel || int(c.n_threads) != s.threads || int(c.n_threads_batch) != s.threads ||
		!bool(c.embeddings) || c.type_k != c.type_v {
		return false
	}
	c.embeddings = false
	c.kv_unified = C.bool(unified)
	return true
}

// embeddingsOn turns the context's pooled embeddings on (an embedding
// model, embed.go), after tuneContextParams turned them off. It reports
// false when the binding's struct is not the mirrored one.
func embeddingsOn(p *llama.ContextParams) bool {
	if unsafe.Sizeof(*p) != C.sizeof_struct_parley_context_params {
		return false
	}
	c := (*C.struct_parley_context_params)(unsafe.Pointer(p))
	c.embeddings = true
	return true
}
