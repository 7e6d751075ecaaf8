package llm

/*
#include <stdint.h>
// As in llama.h (not included: its include path belongs to the binding).
struct llama_context;
extern float *llama_get_logits_ith(struct llama_context *ctx, int32_t i);
*/
import "C"

import (
	"unsafe"

	"github.com/ollama/ollama/llama"
)

// logitsReader reads a batch row's logits for the logprob of the token
// sampled from it. The binding's GetLogitsIth copies the whole vocabulary
// into a new slice (and asks the model for its size through three C calls)
// at every token; view reads llama.cpp's buffer in place instead.
type logitsReader struct {
	lc   *llama.Context
	c    *C.struct_llama_context // nil: the binding's struct is not the mirrored one; copy instead
	nVoc int
}

func newLogitsReader(lc *llama.Context, threads, nVocab int) logitsReader {
	return logitsReader{lc: lc, c: contextPointer(lc, threads), nVoc: nVocab}
}

// view returns row i's logits, valid only until the next decode: the loop
// uses them before it decodes again and never keeps them.
func (r logitsReader) view(i int) []float32 {
	if r.c == nil {
		return r.lc.GetLogitsIth(i)
	}
	p := C.llama_get_logits_ith(r.c, C.int32_t(i))
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), r.nVoc)
}
