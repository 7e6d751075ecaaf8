package llm

/*
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

// llama.h is not included here (its include path belongs to the binding);
// this mirrors its struct llama_model_quantize_params at the pinned
// llama.cpp (enums are C ints). Quantize checks the defaults it returns.
struct parley_quantize_params {
	int32_t nthread;
	int     ftype, output_tensor_type, token_embedding_type;
	bool    allow_requantize, quantize_output_tensor, only_copy, pure, keep_split;
	void   *imatrix, *kv_overrides, *tensor_types, *prune_layers;
};
extern struct parley_quantize_params llama_model_quantize_default_params(void);
extern uint32_t llama_model_quantize(const char *in, const char *out, const struct parley_quantize_params *p);
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Quantize writes a copy of the GGUF file in with its matrices quantized
// to typ ("q8_0" or "q4_0"), with the embedded llama.cpp's quantizer: for
// the benchmark's quantized copies of the synthetic model (tools/decodebench
// -quantize). threads <= 0 means every core.
func Quantize(in, out, typ string, threads int) error {
	ftypes := map[string]C.int{"q4_0": 2, "q8_0": 7} // llama_ftype
	ft, ok := ftypes[typ]
	if !ok {
		return fmt.Errorf("quantize: want q4_0 or q8_0, got %q", typ)
	}
	p := C.llama_model_quantize_default_params()
	// The defaults llama.h documents: Q5_1, the output tensor quantized,
	// nothing else set. Anything else means the mirror is wrong.
	if p.ftype != 9 || !bool(p.quantize_output_tensor) || bool(p.only_copy) || bool(p.pure) || p.imatrix != nil {
		return errors.New("quantize: llama.cpp's quantize parameters are not the ones this build knows")
	}
	p.ftype = ft
	p.nthread = C.int32_t(max(threads, 0))
	cin, cout := C.CString(in), C.CString(out)
	defer C.free(unsafe.Pointer(cin))
	defer C.free(unsafe.Pointer(cout))
	if rc := C.llama_model_quantize(cin, cout, &p); rc != 0 {
		return fmt.Errorf("quantize %s: llama.cpp failed (%d)", in, rc)
	}
	return nil
}
