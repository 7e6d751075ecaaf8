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

// Inspect's estimate of an embedding model counts the KV cache llama.cpp
// opens for it, read back from the engine: a causal model (llama, last
// pooling) keeps n_ctx tokens of K and V over its DefaultEmbedSequences
// sequences, an encoder (bert, an embedding model and a reranker) none.
func TestInspectEstimateEmbedding(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   bool
	}{{"llama-last", true}, {"bert-mean", false}, {"bert-rank", false}} {
		t.Run(tc.name, func(t *testing.T) {
			spec := embedSpec(t, tc.name)
			path := filepath.Join(t.TempDir(), tc.name+".gguf")
			if _, err := synth.Write(context.Background(), path, spec); err != nil {
				t.Fatal(err)
			}
			cfg := llm.Config{Path: path, ContextLength: 256, Parallel: 2, Threads: 2}
			_, est, err := llm.Inspect(cfg)
			if err != nil {
				t.Fatal(err)
			}
			headDim := spec.Dim / spec.Heads
			perToken := int64(spec.Layers * spec.KVHeads * 2 * headDim * 2 /* f16 */)
			es := embedEngines(t, path, cfg, tc.name == "llama-last")
			if len(es) == 0 {
				t.Skip("the current engine is skipped (PARLEY_SKIP_CURRENT_ENGINE=1)")
			}
			for eng, e := range es {
				nCtx, seqs, kv := e.EmbedContext()
				if kv != tc.kv || seqs != llm.DefaultEmbedSequences || nCtx != 256*seqs {
					t.Fatalf("%s: llama.cpp opened %d tokens over %d sequences, KV cache %v; want %d over %d, KV cache %v",
						eng, nCtx, seqs, kv, 256*llm.DefaultEmbedSequences, llm.DefaultEmbedSequences, tc.kv)
				}
				want := int64(0)
				if kv {
					want = perToken * int64(nCtx)
				}
				if est.KVBytes != want {
					t.Fatalf("%s: estimated KV cache %d bytes; llama.cpp's context holds %d (%d tokens over %d sequences, KV cache %v)",
						eng, est.KVBytes, want, nCtx, seqs, kv)
				}
			}
		})
	}
}
