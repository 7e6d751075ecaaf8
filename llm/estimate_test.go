package llm_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// Inspect's memory estimate, on a synthetic model of a known shape: the
// file, and K and V for every layer, KV head and token of every slot.
func TestInspectEstimate(t *testing.T) {
	spec := synth.DefaultSpec()
	spec.VocabFrom = testmodel.Path(t)
	spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN, spec.Context = 3, 128, 4, 2, 256, 2048
	path := filepath.Join(t.TempDir(), "shape.gguf")
	if _, err := synth.Write(context.Background(), path, spec); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	info, est, err := llm.Inspect(llm.Config{Path: path, ContextLength: 512, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	const headDim = 128 / 4
	wantKV := int64(3 * 2 * (headDim + headDim) * 2 /* f16 */ * 512 * 2)
	if est.WeightBytes != st.Size() || est.KVBytes != wantKV || est.ComputeBytes <= 0 || est.Total() != est.WeightBytes+est.KVBytes+est.ComputeBytes {
		t.Fatalf("estimate %+v; want weights %d, KV %d, some compute", est, st.Size(), wantKV)
	}
	if info.ContextLength != 512 || info.Parallel != 2 || info.Layers != 3 || !strings.Contains(est.String(), "KV cache 0.8 MiB") {
		t.Fatalf("info %+v, %s", info, est)
	}
	// A q8_0 cache takes 34 bytes per 32 values instead of 64.
	_, q8, err := llm.Inspect(llm.Config{Path: path, ContextLength: 512, Parallel: 2, KVCacheType: "q8_0", FlashAttention: "on"})
	if err != nil || q8.KVBytes != wantKV*34/64 {
		t.Fatalf("q8_0 KV %d, %v; want %d", q8.KVBytes, err, wantKV*34/64)
	}
	// A damaged file: an error naming it, before llama.cpp sees it.
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(bad, b[:4096], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := llm.Inspect(llm.Config{Path: bad}); err == nil || !strings.Contains(err.Error(), "bad.gguf") {
		t.Fatalf("damaged file: %v", err)
	}
}
