package llm

/*
#include <stddef.h>
#include <stdint.h>
// llama.h is not included here (its include path belongs to the binding);
// these match its declarations at the pinned llama.cpp: llama_seq_id is an
// int32_t. LLAMA_COMMIT is the binding's build-info.cpp global.
struct llama_context;
extern size_t   llama_state_seq_get_size(struct llama_context *ctx, int32_t seq_id);
extern size_t   llama_state_seq_get_data(struct llama_context *ctx, uint8_t *dst, size_t size, int32_t seq_id);
extern size_t   llama_state_seq_set_data(struct llama_context *ctx, const uint8_t *src, size_t size, int32_t dest_seq_id);
extern uint32_t llama_n_ctx(const struct llama_context *ctx);
extern uint32_t llama_n_seq_max(const struct llama_context *ctx);
extern const char *LLAMA_COMMIT;
static const char *parley_llama_commit(void) { return LLAMA_COMMIT; }
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/ollama/ollama/llama"
)

// seqState reaches llama.cpp's per-sequence state functions, which the
// binding does not wrap, through the context pointer inside the binding's
// llama.Context (its first field). newSeqState checks that pointer against
// the shape the engine created the context with before anything uses it.
type seqState struct {
	c *C.struct_llama_context
}

// llamaCommit is the llama.cpp commit the binding was built from: states
// written by another build are not read back.
func llamaCommit() string { return C.GoString(C.parley_llama_commit()) }

// newSeqState returns the state functions of lc, or false when lc's first
// field is not a context of nCtx cells and nSeq sequences (the binding
// changed shape: the KV cache is then not swapped).
func newSeqState(lc *llama.Context, nCtx, nSeq int) (seqState, bool) {
	if lc == nil {
		return seqState{}, false
	}
	p := *(**C.struct_llama_context)(unsafe.Pointer(lc))
	if p == nil || int(C.llama_n_ctx(p)) != nCtx || int(C.llama_n_seq_max(p)) != nSeq {
		return seqState{}, false
	}
	return seqState{c: p}, true
}

var errStateRefused = errors.New("llama.cpp refused the state")

// get copies sequence seq's state (its cells, positions, keys and values).
func (s seqState) get(seq int) ([]byte, error) {
	n := C.llama_state_seq_get_size(s.c, C.int32_t(seq))
	if n == 0 {
		return nil, errStateRefused
	}
	buf := make([]byte, n)
	got := C.llama_state_seq_get_data(s.c, (*C.uint8_t)(unsafe.Pointer(&buf[0])), n, C.int32_t(seq))
	if got == 0 || got > n {
		return nil, errStateRefused
	}
	return buf[:got], nil
}

// set loads a state that get returned into sequence seq, replacing what it
// held. On failure llama.cpp has cleared the sequence.
func (s seqState) set(seq int, state []byte) error {
	if len(state) == 0 {
		return errStateRefused
	}
	if C.llama_state_seq_set_data(s.c, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), C.int32_t(seq)) == 0 {
		return errStateRefused
	}
	return nil
}
