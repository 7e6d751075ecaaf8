package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// Embeddings and rerank: Parley's outputs on synthetic embedding models
// and a reranker (internal/synth, the shapes scripts/embedding-reference.sh
// gives tools/mkgguf) equal those of llama.cpp's own embedding tool, built
// from the current engine's pinned source and recorded in
// testdata/embedding-reference.json, on both engines.

type embedReference struct {
	Tool      string   `json:"tool"`
	Inputs    []string `json:"inputs"`
	Query     string   `json:"query"`
	Documents []string `json:"documents"`
	Models    map[string]struct {
		Description string      `json:"description"`
		Raw         [][]float64 `json:"raw"`
		L2          [][]float64 `json:"l2"`
		Scores      []float64   `json:"scores"`
	} `json:"models"`
}

func readEmbedReference(t *testing.T) embedReference {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "embedding-reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref embedReference
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// embedSpec is the synthetic model name as scripts/embedding-reference.sh
// makes it (its flags, here as a Spec).
func embedSpec(t *testing.T, name string) synth.Spec {
	s := synth.DefaultSpec()
	s.Name, s.VocabFrom = name, testmodel.Path(t)
	s.Layers, s.Dim, s.Heads, s.FFN, s.Context = 2, 64, 4, 128, 512
	s.Std, s.ResidStd, s.Type = 0.2, 0.2, "f32"
	switch name {
	case "bert-mean", "bert-cls", "bert-rank":
		s.Arch, s.KVHeads, s.Pooling = "bert", 4, name[len("bert-"):]
	case "llama-last":
		s.KVHeads, s.Pooling = 2, "last"
	default:
		t.Fatalf("no spec for %s", name)
	}
	return s
}

// embedModel writes the synthetic model name and checks that it is the
// one the reference was computed on.
func embedModel(t *testing.T, ref embedReference, name string) string {
	t.Helper()
	spec := embedSpec(t, name)
	if got, want := spec.Description(), ref.Models[name].Description; got != want {
		t.Fatalf("%s: the test's spec is %q, the reference's %q: run scripts/embedding-reference.sh", name, got, want)
	}
	path := filepath.Join(t.TempDir(), name+".gguf")
	if _, err := synth.Write(context.Background(), path, spec); err != nil {
		t.Fatal(err)
	}
	return path
}

// close reports whether got equals want within float32 rounding of the
// tool's 7 printed decimals and of two builds' kernels.
func closeTo(got float32, want float64) bool {
	return math.Abs(float64(got)-want) <= 1e-4+1e-4*math.Abs(want)
}

// embedEngines opens path on each engine (engines), or with currentOnly on
// the current engine alone: the embedded engine's llama.cpp reads no
// pooling type for the llama architecture, and refuses such a model.
func embedEngines(t *testing.T, path string, cfg llm.Config, currentOnly bool) map[string]*llm.Engine {
	t.Helper()
	if !currentOnly {
		return engines(t, path, cfg)
	}
	c := cfg
	c.Path, c.Engine = path, llm.EngineEmbedded
	if e, err := llm.Open(c); err == nil || !strings.Contains(err.Error(), "--engine current") {
		if e != nil {
			e.Close()
		}
		t.Fatalf("the embedded engine on a llama with pooling: %v, want a refusal that names the current engine", err)
	}
	if os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") == "1" {
		return nil
	}
	c.Engine, c.LibDir = llm.EngineCurrent, currentLibDir(t)
	e, err := llm.Open(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return map[string]*llm.Engine{llm.EngineCurrent: e}
}

func embedAll(t *testing.T, e *llm.Engine, texts []string) [][]float32 {
	t.Helper()
	ctx := context.Background()
	var inputs [][]int
	for _, s := range texts {
		toks, err := e.EmbedTokenize(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, toks)
	}
	out, err := e.Embed(ctx, "", inputs)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(texts) {
		t.Fatalf("%d outputs for %d inputs", len(out), len(texts))
	}
	return out
}

func TestEmbedMatchesLlamaCpp(t *testing.T) {
	ref := readEmbedReference(t)
	for _, name := range []string{"bert-mean", "bert-cls", "llama-last"} {
		t.Run(name, func(t *testing.T) {
			path := embedModel(t, ref, name)
			es := embedEngines(t, path, llm.Config{ContextLength: 512, Parallel: 2, Threads: 2}, name == "llama-last")
			for eng, e := range es {
				info := e.EmbedInfo()
				if want := name[len(name)-len(info.Pooling):]; info.Pooling == "" || want != info.Pooling || info.Dimensions != 64 {
					t.Fatalf("%s: EmbedInfo %+v", eng, info)
				}
				out := embedAll(t, e, ref.Inputs)
				want := ref.Models[name].Raw
				worst := 0.0
				for i := range want {
					if len(out[i]) != len(want[i]) {
						t.Fatalf("%s: input %d: %d values, llama.cpp %d", eng, i, len(out[i]), len(want[i]))
					}
					for j := range want[i] {
						worst = max(worst, math.Abs(float64(out[i][j])-want[i][j]))
						if !closeTo(out[i][j], want[i][j]) {
							t.Fatalf("%s: input %d value %d: %g, llama.cpp %g", eng, i, j, out[i][j], want[i][j])
						}
					}
				}
				t.Logf("%s: largest difference from llama.cpp's tool %.2g", eng, worst)
			}
		})
	}
}

func TestRerankMatchesLlamaCpp(t *testing.T) {
	ref := readEmbedReference(t)
	path := embedModel(t, ref, "bert-rank")
	for eng, e := range embedEngines(t, path, llm.Config{ContextLength: 512, Threads: 2}, false) {
		if info := e.EmbedInfo(); info.Pooling != llm.PoolingRank || info.Dimensions != 1 || info.Causal {
			t.Fatalf("%s: EmbedInfo %+v", eng, info)
		}
		var inputs [][]int
		for _, d := range ref.Documents {
			toks, err := e.RerankTokens(context.Background(), ref.Query, d)
			if err != nil {
				t.Fatal(err)
			}
			inputs = append(inputs, toks)
		}
		out, err := e.Embed(context.Background(), "", inputs)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range ref.Models["bert-rank"].Scores {
			if len(out[i]) != 1 || !closeTo(out[i][0], want) {
				t.Fatalf("%s: document %d: score %v, llama.cpp %g", eng, i, out[i], want)
			}
		}
	}
}

// TestEmbedBatches sends more inputs than one batch holds, from several
// clients at once, through a micro-batch of 48 tokens and 3 sequences: every
// input's output equals the one it has alone.
func TestEmbedBatches(t *testing.T) {
	ref := readEmbedReference(t)
	path := embedModel(t, ref, "bert-mean")
	for eng, e := range embedEngines(t, path, llm.Config{ContextLength: 512, BatchSize: 48, Parallel: 3, Threads: 2}, false) {
		if got := e.EmbedInfo().MaxTokens; got != 48 {
			t.Fatalf("%s: MaxTokens %d, want the micro-batch, 48", eng, got)
		}
		texts := []string{"hello world", "Once upon a time there was a little cat.", "a", "The dog ran.", "She was happy and she played.", "b"}
		alone := make([][]float32, len(texts))
		for i, s := range texts {
			alone[i] = embedAll(t, e, []string{s})[0]
		}
		var many []string
		for range 4 {
			many = append(many, texts...)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for c := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, client := context.Background(), fmt.Sprintf("client-%d", c%2)
				var inputs [][]int
				for _, s := range many {
					toks, err := e.EmbedTokenize(ctx, s)
					if err != nil {
						errs <- err
						return
					}
					inputs = append(inputs, toks)
				}
				out, err := e.Embed(ctx, client, inputs)
				if err != nil {
					errs <- err
					return
				}
				for i := range many {
					for j, v := range out[i] {
						if math.Abs(float64(v-alone[i%len(texts)][j])) > 1e-4 {
							errs <- fmt.Errorf("client %d input %d value %d: %g in a batch, %g alone", c, i, j, v, alone[i%len(texts)][j])
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: %v", eng, err)
		}
		if st := e.Stats(); st.SlotsBusy != 0 || st.Queued != 0 {
			t.Fatalf("%s: after the calls: %+v", eng, st)
		}
	}
}

// TestEmbedRefusals: an input over the micro-batch is refused before
// llama.cpp sees it (an encoder aborts the process on one), and the engine
// serves the next call; a chat model refuses Embed and an embedding model
// refuses Generate, each with a clear error.
func TestEmbedRefusals(t *testing.T) {
	ref := readEmbedReference(t)
	path := embedModel(t, ref, "bert-mean")
	for eng, e := range embedEngines(t, path, llm.Config{ContextLength: 512, BatchSize: 32, Threads: 2}, false) {
		long := make([]int, 33)
		for i := range long {
			long[i] = 100 + i
		}
		_, err := e.Embed(context.Background(), "", [][]int{{1, 2}, long})
		if _, limit, ok := parley.PromptLimit(err); !ok || limit != 32 {
			t.Fatalf("%s: an input of 33 tokens through a micro-batch of 32: %v", eng, err)
		}
		for _, bad := range [][][]int{nil, {{}}, {{-1}}, {{1 << 30}}} {
			if _, err := e.Embed(context.Background(), "", bad); parley.ErrorCode(err) != parley.EInvalid {
				t.Fatalf("%s: Embed(%v): %v, want invalid", eng, bad, err)
			}
		}
		if _, err := e.RerankTokens(context.Background(), "q", "d"); parley.ErrorCode(err) != parley.EInvalid {
			t.Fatalf("%s: RerankTokens on a mean-pooling model: %v", eng, err)
		}
		_, err = e.Generate(context.Background(), parley.GenerateRequest{Tokens: []int{1, 2}, Params: parley.DefaultParams()})
		if parley.ErrorCode(err) != parley.EInvalid {
			t.Fatalf("%s: Generate on an embedding model: %v", eng, err)
		}
		if out := embedAll(t, e, []string{"still here"}); len(out[0]) != 64 {
			t.Fatalf("%s: after the refusals: %v", eng, out)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := e.Embed(ctx, "", [][]int{{1, 2, 3}}); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: a cancelled call: %v", eng, err)
		}
	}
	for eng, e := range embedEngines(t, testmodel.Path(t), llm.Config{ContextLength: 256, Threads: 2}, false) {
		if info := e.EmbedInfo(); info.Pooling != "" {
			t.Fatalf("%s: a chat model's EmbedInfo: %+v", eng, info)
		}
		_, err := e.Embed(context.Background(), "", [][]int{{1, 2}})
		if parley.ErrorCode(err) != parley.EInvalid || !strings.Contains(parley.ErrorMessage(err), "not an embedding model") {
			t.Fatalf("%s: Embed on a chat model: %v", eng, err)
		}
	}
}

// TestEmbedContextIsTheBatch: an embedding model's context per sequence is
// its micro-batch when ContextLength asks for more (no input is longer), as
// llama.cpp opens it (rounded up to a multiple of 256) and as Inspect
// estimates it; an input of exactly the micro-batch embeds and one token
// more is refused.
func TestEmbedContextIsTheBatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kv     bool
		batch  int // ContextLength 512 asks for more
		perSeq int // what llama.cpp opens per sequence
	}{{"llama-last", true, 256, 256}, {"llama-last", true, 128, 256}, {"bert-mean", false, 256, 256}} {
		t.Run(fmt.Sprintf("%s-%d", tc.name, tc.batch), func(t *testing.T) {
			spec := embedSpec(t, tc.name)
			path := filepath.Join(t.TempDir(), tc.name+".gguf")
			if _, err := synth.Write(context.Background(), path, spec); err != nil {
				t.Fatal(err)
			}
			cfg := llm.Config{Path: path, ContextLength: 512, BatchSize: tc.batch, Parallel: 2, Threads: 2}
			info, est, err := llm.Inspect(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if info.ContextLength != tc.batch {
				t.Fatalf("Inspect: context length %d, want the micro-batch, %d", info.ContextLength, tc.batch)
			}
			perToken := int64(spec.Layers * spec.KVHeads * 2 * (spec.Dim / spec.Heads) * 2 /* f16 */)
			es := embedEngines(t, path, cfg, tc.name == "llama-last")
			if len(es) == 0 {
				t.Skip("the current engine is skipped (PARLEY_SKIP_CURRENT_ENGINE=1)")
			}
			for eng, e := range es {
				nCtx, seqs, kv := e.EmbedContext()
				if kv != tc.kv || seqs != llm.DefaultEmbedSequences || nCtx != tc.perSeq*seqs {
					t.Fatalf("%s: llama.cpp opened %d tokens over %d sequences, KV cache %v; want %d over %d, KV cache %v",
						eng, nCtx, seqs, kv, tc.perSeq*llm.DefaultEmbedSequences, llm.DefaultEmbedSequences, tc.kv)
				}
				want := int64(0)
				if kv {
					want = perToken * int64(nCtx)
				}
				if est.KVBytes != want {
					t.Fatalf("%s: estimated KV cache %d bytes; llama.cpp's context holds %d", eng, est.KVBytes, want)
				}
				if got := e.EmbedInfo().MaxTokens; got != tc.batch {
					t.Fatalf("%s: MaxTokens %d, want %d", eng, got, tc.batch)
				}
				atLimit := make([]int, tc.batch)
				for i := range atLimit {
					atLimit[i] = 100 + i%200
				}
				out, err := e.Embed(context.Background(), "", [][]int{atLimit, {1, 2}})
				if err != nil || len(out) != 2 || len(out[0]) != spec.Dim {
					t.Fatalf("%s: an input of exactly %d tokens: %d outputs, %v", eng, tc.batch, len(out), err)
				}
				nonzero := false
				for _, v := range out[0] {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("%s: the input at the limit embeds to %v", eng, out[0])
					}
					nonzero = nonzero || v != 0
				}
				if !nonzero {
					t.Fatalf("%s: the input at the limit embeds to zeros", eng)
				}
				_, err = e.Embed(context.Background(), "", [][]int{append(atLimit, 100)})
				if _, limit, ok := parley.PromptLimit(err); !ok || limit != tc.batch {
					t.Fatalf("%s: an input of %d tokens: %v, want refused at %d", eng, tc.batch+1, err, tc.batch)
				}
			}
		})
	}
}
