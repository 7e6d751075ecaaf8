package llm

/*
#include <stddef.h>
#include <stdint.h>
// As in llama.h (not included: its include path belongs to the binding).
struct llama_context;
extern size_t llama_state_seq_get_size(struct llama_context *ctx, int32_t seq_id);
extern size_t llama_state_seq_get_data(struct llama_context *ctx, uint8_t *dst, size_t size, int32_t seq_id);
extern size_t llama_state_seq_set_data(struct llama_context *ctx, const uint8_t *src, size_t size, int32_t dest_seq_id);
*/
import "C"

import (
	"errors"
	"unsafe"
)

// StateSeqSave returns seq's KV cache state, as llama.cpp serialises it.
func (be *embedded) StateSeqSave(seq int) ([]byte, error) {
	c := be.logits.c
	if c == nil {
		return nil, errNoState
	}
	n := C.llama_state_seq_get_size(c, C.int32_t(seq))
	if n == 0 {
		return nil, nil
	}
	buf := make([]byte, int(n))
	if got := C.llama_state_seq_get_data(c, (*C.uint8_t)(unsafe.Pointer(&buf[0])), n, C.int32_t(seq)); got != n {
		return nil, errors.New("llm: llama.cpp wrote a sequence state of another size than it announced")
	}
	return buf, nil
}

// StateSeqRestore loads a state from StateSeqSave into seq (whose cells it
// replaces).
func (be *embedded) StateSeqRestore(seq int, state []byte) error {
	c := be.logits.c
	if c == nil {
		return errNoState
	}
	if len(state) == 0 {
		return errors.New("llm: empty sequence state")
	}
	if C.llama_state_seq_set_data(c, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), C.int32_t(seq)) == 0 {
		return errors.New("llm: llama.cpp refused the sequence state")
	}
	return nil
}
