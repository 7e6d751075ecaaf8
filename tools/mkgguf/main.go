// Command mkgguf writes a synthetic GGUF model for benchmarks: the shape of a
// real small chat model (by default SmolLM2-135M: llama architecture, 30
// layers, dim 576, 9 query heads / 3 KV heads, FFN 1536) with seeded random
// weights, and the vocabulary of a donor GGUF (by default stories260K, 512
// tokens) so it tokenizes exactly like the donor. -vocab-size pads that
// vocabulary to a real model's size (SmolLM2: 49152) with tokens no text
// holds, so the output layer and the sampler cost what the real model's do.
// Its output is nonsense, but every token costs what a token of the real
// model costs, which is all a throughput benchmark needs; and greedy decoding never stops early or loops on
// one token (see tensors in internal/synth for how the weights ensure that).
//
// Usage:
//
//	go run ./tools/mkgguf -o ~/.cache/parley/models/synthetic-smollm2-135m-f16.gguf
//
// The output is deterministic for a given seed and shape. If the output file
// already holds a model made with the same settings, mkgguf leaves it alone
// (use -force to rewrite it). Never write it into the repository.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() {
	harness.Main("mkgguf", func(ctx context.Context, args []string, stdout io.Writer) error {
		return run(ctx, args, stdout, os.Stderr)
	})
}

// run parses args, then writes (or keeps) the model and prints its path on stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	spec := synth.DefaultSpec()
	var (
		out   string
		force bool
	)
	fs := flag.NewFlagSet("mkgguf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&out, "o", defaultOutput(), "output GGUF path (outside the repository)")
	fs.StringVar(&spec.VocabFrom, "vocab", defaultVocab(), "GGUF whose tokenizer.* metadata (vocabulary) is copied")
	fs.IntVar(&spec.VocabSize, "vocab-size", 0, "pad the vocabulary to this many tokens (a real model's output layer and sampling cost; SmolLM2: 49152); 0: the donor's")
	fs.StringVar(&spec.Name, "name", spec.Name, "general.name of the model")
	fs.IntVar(&spec.Layers, "layers", spec.Layers, "transformer blocks")
	fs.IntVar(&spec.Dim, "dim", spec.Dim, "embedding length (hidden size)")
	fs.IntVar(&spec.Heads, "heads", spec.Heads, "attention (query) heads; must divide -dim")
	fs.IntVar(&spec.KVHeads, "kv-heads", spec.KVHeads, "key/value heads (grouped-query attention); must divide -heads")
	fs.IntVar(&spec.FFN, "ffn", spec.FFN, "feed-forward length")
	fs.IntVar(&spec.Context, "ctx", spec.Context, "training context length written to the metadata")
	fs.Float64Var(&spec.RopeTheta, "rope-theta", spec.RopeTheta, "RoPE frequency base")
	fs.Float64Var(&spec.RMSEps, "rms-eps", spec.RMSEps, "RMS norm epsilon")
	fs.BoolVar(&spec.TiedEmbeddings, "tied", spec.TiedEmbeddings, "tie the output projection to token_embd (no output.weight) as SmolLM2 does; greedy output then repeats one token")
	fs.StringVar(&spec.Type, "type", spec.Type, "weight type of the matrices: f16 or f32 (norms are always f32)")
	fs.Float64Var(&spec.Std, "std", spec.Std, "standard deviation of the q, k, v, gate and up weights")
	fs.Float64Var(&spec.ResidStd, "resid-std", spec.ResidStd, "standard deviation of attn_output and ffn_down, which write into the residual stream")
	fs.Uint64Var(&spec.Seed, "seed", spec.Seed, "random seed; the same seed and shape give the same bytes")
	fs.StringVar(&spec.Arch, "arch", "llama", "architecture: llama (a chat model, or a causal embedding model with -pooling), qwen2vl (Qwen2-VL's text model, M-RoPE, with its vision tokens) or bert (an encoder embedding model, or with -pooling rank a reranker)")
	fs.StringVar(&spec.Pooling, "pooling", "", "make an embedding model that pools with mean, cls or last (rank: a reranker, -arch bert); empty: a chat model")
	fs.BoolVar(&force, "force", false, "rewrite the output even if it already holds this model")
	var mmproj, mmprojType string
	fs.StringVar(&mmproj, "mmproj", "", "also write a synthetic vision projector (llama.cpp's clip architecture, a LLaVA MLP projector into -dim) to this path, for libmtmd tests")
	fs.StringVar(&mmprojType, "mmproj-type", synth.ProjectorMLP, "the projector's type: mlp (LLaVA's) or qwen2vl_merger (Qwen2-VL's, M-RoPE positions; for -arch qwen2vl)")
	fs.Func("script", "JSON file of a synth.Script (template, control, text, after, reply, end): add a chat template and its tokens, and make greedy decoding write the reply", func(path string) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		spec.Script = new(synth.Script)
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		return dec.Decode(spec.Script)
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if out == "" {
		return errors.New("-o is required")
	}
	if mmproj != "" {
		p := synth.DefaultProjector()
		p.ProjDim, p.Seed, p.Type = spec.Dim, spec.Seed, mmprojType
		if err := synth.WriteProjector(ctx, mmproj, p); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "mkgguf: wrote the projector %s (%+v)\n", mmproj, p)
	}

	if !force {
		same, err := synth.Matches(out, spec)
		if err != nil {
			return err
		}
		if same {
			fmt.Fprintf(stderr, "mkgguf: %s already holds %s; keeping it (-force rewrites)\n", out, spec.Description())
			fmt.Fprintln(stdout, out)
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("create output folder: %w", err)
	}
	start := time.Now()
	info, err := synth.Write(ctx, out, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "mkgguf: wrote %s: %s, %d parameters, %d tensors, %.1f MiB in %s\n",
		out, spec.Description(), info.Parameters, info.Tensors, float64(info.Bytes)/(1<<20), time.Since(start).Round(time.Millisecond))
	fmt.Fprintln(stdout, out)
	return nil
}

// defaultOutput is a per-user cache path, never inside the repository.
func defaultOutput() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "parley", "models", "synthetic-smollm2-135m-f16.gguf")
}

// defaultVocab is $PARLEY_TEST_MODEL, else the shared test model beside the
// repository root (found by walking up to go.mod from the working directory).
func defaultVocab() string {
	if p := os.Getenv(repo.ModelEnv); p != "" {
		return p
	}
	return repo.TestModel(repo.WorkingRoot())
}
