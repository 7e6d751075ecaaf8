// Package synth writes synthetic GGUF models: the shape of a real small chat model with seeded random weights and a
// donor's vocabulary, for benchmarks (tools/mkgguf) and for tests that need a model that behaves in a known way
// (a scripted reply, see script.go).
package synth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// Spec is the shape and content of a synthetic model.
type Spec struct {
	Name      string
	VocabFrom string // donor GGUF whose tokenizer.* metadata is copied
	// VocabSize, when above the donor's (plus a script's tokens), pads the vocabulary to this many tokens
	// (see padVocab): a real model's output layer and sampling cost over a small donor's tokenizer.
	VocabSize      int
	Layers         int
	Dim            int // embedding length
	Heads          int // query heads; Dim/Heads is the head size
	KVHeads        int // key/value heads; Heads % KVHeads == 0
	FFN            int // feed-forward length
	Context        int // training context written to the metadata
	RopeTheta      float64
	RMSEps         float64
	TiedEmbeddings bool    // omit output.weight: llama.cpp then projects with token_embd
	Type           string  // "f16" or "f32": the type of every matrix
	Std            float64 // standard deviation of q, k, v, gate and up weights
	ResidStd       float64 // standard deviation of attn_output and ffn_down weights
	Seed           uint64
	// Script, when set, adds a chat template and its special tokens and makes greedy decoding write a known reply
	// (see Script).
	Script *Script
	// Arch is the architecture: "" or "llama" (a chat model, or a causal embedding model with Pooling), "qwen2vl"
	// (the text model of Qwen2-VL: llama's tensors with M-RoPE, rotating each head's dimensions in sections by
	// the time, height and width of a position, and the tokens a Qwen-VL image is wrapped in; see QwenVLSpec), or
	// "bert" (an encoder: an embedding model or, with Pooling "rank", a reranker; see bert.go).
	Arch string
	// Pooling, when set (mean, cls, last or rank), makes the model an embedding model: <arch>.pooling_type.
	Pooling string
}

// DefaultSpec is the shape of SmolLM2-135M (HuggingFaceTB/SmolLM2-135M
// config.json: 30 layers, hidden 576, 9 heads, 3 KV heads, intermediate 1536,
// rope_theta 100000, rms_norm_eps 1e-5), with the context cut to 2048 tokens,
// the benchmark's per-session context. SmolLM2 ties its output projection to
// the embeddings; here output.weight is separate (see tensors for why). With
// the donor's 512-token vocabulary that adds 0.3M of 106M parameters to the
// compute; with VocabSize 49152 (SmolLM2's) it adds SmolLM2's 28M.
//
// F16 by default: decoding one token on a CPU streams every weight through the
// cores once, so it is bound by memory bandwidth, and F16 halves the bytes of
// F32 (about 212 MB instead of 425 MB per token here). ggml's CPU backend has
// F16C/AVX2 dot products for F16 weights, so the arithmetic costs no more. F16
// is also the type llama.cpp's own converter writes by default.
func DefaultSpec() Spec {
	return Spec{
		Name:           "parley-synthetic-smollm2-135m",
		Layers:         30,
		Dim:            576,
		Heads:          9,
		KVHeads:        3,
		FFN:            1536,
		Context:        2048,
		RopeTheta:      100000,
		RMSEps:         1e-5,
		TiedEmbeddings: false,
		Type:           "f16",
		Std:            0.02,
		ResidStd:       0.002,
		Seed:           1,
	}
}

// generatorVersion changes whenever the same Spec would produce other bytes,
// so that Matches does not keep a model made by an older mkgguf.
const generatorVersion = 2

// Description is a one-line summary of everything that determines the output
// bytes except the donor's content. It is stored as general.description, which
// is how Matches recognizes a file made with the same settings.
func (s Spec) Description() string {
	script := ""
	if s.Script != nil {
		script = " script=" + s.Script.hash()
	}
	if s.VocabSize > 0 {
		script += fmt.Sprintf(" vocab_size=%d", s.VocabSize)
	}
	if s.Arch != "" && s.Arch != "llama" {
		script += " arch=" + s.Arch
	}
	if s.Pooling != "" {
		script += " pooling=" + s.Pooling
	}
	return fmt.Sprintf("parley synthetic model v%d: layers=%d dim=%d heads=%d kv_heads=%d ffn=%d ctx=%d rope_theta=%g rms_eps=%g tied=%t type=%s std=%g resid_std=%g seed=%d vocab_from=%s",
		generatorVersion, s.Layers, s.Dim, s.Heads, s.KVHeads, s.FFN, s.Context, s.RopeTheta, s.RMSEps, s.TiedEmbeddings, s.Type, s.Std, s.ResidStd, s.Seed, filepath.Base(s.VocabFrom)) + script
}

func (s Spec) validate() error {
	switch {
	case s.Layers < 1 || s.Dim < 1 || s.Heads < 1 || s.KVHeads < 1 || s.FFN < 1 || s.Context < 1:
		return errors.New("layers, dim, heads, kv-heads, ffn and ctx must all be positive")
	case s.Dim%s.Heads != 0:
		return fmt.Errorf("dim %d is not a multiple of heads %d", s.Dim, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("heads %d is not a multiple of kv-heads %d", s.Heads, s.KVHeads)
	case (s.Dim/s.Heads)%2 != 0:
		return fmt.Errorf("head size %d must be even for RoPE", s.Dim/s.Heads)
	case s.Type != "f16" && s.Type != "f32":
		return fmt.Errorf("type %q: want f16 or f32", s.Type)
	case !(s.Std > 0) || s.Std > 1 || !(s.ResidStd > 0) || s.ResidStd > 1:
		return fmt.Errorf("std %g, resid-std %g: want 0 < std <= 1", s.Std, s.ResidStd)
	case !(s.RopeTheta > 0) || !(s.RMSEps > 0):
		return errors.New("rope-theta and rms-eps must be positive")
	case s.VocabSize < 0 || s.VocabSize > maxVocab:
		return fmt.Errorf("vocab-size %d: want 0 (the donor's) up to %d", s.VocabSize, maxVocab)
	case s.VocabFrom == "":
		return errors.New("no vocabulary donor (-vocab)")
	case s.Script != nil && (s.Script.Reply == "" || s.Script.After == ""):
		return errors.New("script: after and reply are required")
	case s.Arch != "" && s.Arch != "llama" && s.Arch != "bert" && s.Arch != ArchQwen2VL:
		return fmt.Errorf("arch %q: want llama, %s or bert", s.Arch, ArchQwen2VL)
	case s.Arch == ArchQwen2VL && (s.Dim/s.Heads)%8 != 0:
		return fmt.Errorf("head size %d: M-RoPE's sections need a multiple of 8", s.Dim/s.Heads)
	case s.Arch == "bert" && s.Script != nil:
		return errors.New("a bert model generates nothing: no script")
	case s.Arch == "bert" && s.Pooling == "":
		return errors.New("a bert model needs a pooling type (mean, cls, last or rank)")
	case s.Pooling == "rank" && s.Arch != "bert":
		return errors.New("pooling rank needs arch bert (its classifier head)")
	}
	if _, ok := poolingTypes[s.Pooling]; !ok && s.Pooling != "" {
		return fmt.Errorf("pooling %q: want mean, cls, last or rank", s.Pooling)
	}
	return nil
}

// ArchQwen2VL is Spec.Arch of a Qwen2-VL text model.
const ArchQwen2VL = "qwen2vl"

// visionTokens are the control tokens libmtmd wraps a Qwen-VL image in.
var visionTokens = []string{"<|vision_start|>", "<|vision_end|>"}

// QwenVLSpec is a tiny Qwen2-VL text model with vocab's vocabulary, for QwenVLProjector: 2 layers of width 64, 4
// heads of 16 (M-RoPE sections of 2, 3 and 3 pairs). Its weights are large enough that the prompt, an image's
// embeddings and their positions all change what greedy decoding writes, as a trained model's do.
func QwenVLSpec(vocab string) Spec {
	return Spec{
		Name: "parley-synthetic-qwen2vl", VocabFrom: vocab, Arch: ArchQwen2VL,
		Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 4096, RopeTheta: 10000, RMSEps: 1e-6,
		Type: "f32", Std: 0.5, ResidStd: 0.5, Seed: 1,
	}
}

// addControl appends the tokens of texts that voc lacks as control tokens.
func addControl(voc vocabulary, texts []string) vocabulary {
	out := vocabulary{tokens: slices.Clone(voc.tokens), types: slices.Clone(voc.types)}
	for _, t := range texts {
		if !slices.Contains(out.tokens, t) {
			out.tokens = append(out.tokens, t)
			out.types = append(out.types, tokenTypeControl)
		}
	}
	return out
}

// Info describes a written model.
type Info struct {
	Parameters uint64
	Tensors    int
	Bytes      int64
}

// Matches reports whether path holds a GGUF whose general.description equals
// spec's. A missing file is not an error.
func Matches(path string, spec Spec) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("open existing output: %w", err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return false, nil // not a GGUF (or truncated): rewrite it
	}
	return g.KV().String("general.description") == spec.Description(), nil
}

// Token types of the GGUF tokenizer (llama.cpp's llama_token_type).
const tokenTypeNormal = 1

// Write generates the model and writes it to path atomically (a temporary
// file in the same folder, renamed when complete), so an interrupted run
// never leaves a file that Matches would accept.
func Write(ctx context.Context, path string, spec Spec) (Info, error) {
	if err := spec.validate(); err != nil {
		return Info{}, fmt.Errorf("spec: %w", err)
	}
	tokenizer, voc, err := readVocab(spec.VocabFrom)
	if err != nil {
		return Info{}, err
	}
	var chains [][]int
	if spec.Script != nil {
		sc, err := spec.Script.apply(voc, int(tokenizer.Uint("tokenizer.ggml.eos_token_id")))
		if err != nil {
			return Info{}, err
		}
		voc, chains = sc.voc, sc.chains
		scriptTokenizer(tokenizer, voc, spec.Script.Template)
	}
	if spec.Arch == ArchQwen2VL {
		voc = addControl(voc, visionTokens)
		scriptTokenizer(tokenizer, voc, "")
	}
	if spec.VocabSize > 0 {
		if voc, err = padVocab(tokenizer, voc, spec.VocabSize); err != nil {
			return Info{}, err
		}
	}
	vocab := len(voc.tokens)
	if spec.Arch == "bert" {
		return writeBERT(ctx, path, spec, tokenizer, voc)
	}
	ts := tensors(ctx, spec, voc, chains)
	var params uint64
	for _, t := range ts {
		params += t.Elements()
	}
	arch := "llama"
	if spec.Arch == ArchQwen2VL {
		arch = ArchQwen2VL
	}
	kv := ggml.KV{
		"general.architecture":                     arch,
		"general.name":                             spec.Name,
		"general.description":                      spec.Description(),
		"general.file_type":                        fileType(spec.Type),
		"general.parameter_count":                  params,
		arch + ".block_count":                      uint32(spec.Layers),
		arch + ".context_length":                   uint32(spec.Context),
		arch + ".embedding_length":                 uint32(spec.Dim),
		arch + ".feed_forward_length":              uint32(spec.FFN),
		arch + ".attention.head_count":             uint32(spec.Heads),
		arch + ".attention.head_count_kv":          uint32(spec.KVHeads),
		arch + ".attention.layer_norm_rms_epsilon": float32(spec.RMSEps),
		arch + ".rope.freq_base":                   float32(spec.RopeTheta),
		arch + ".rope.dimension_count":             uint32(spec.Dim / spec.Heads),
		arch + ".vocab_size":                       uint32(vocab),
	}
	if arch == ArchQwen2VL {
		// Qwen2-VL's split of a head's rotated pairs (16, 24, 24 of 64): time, height, width, and none for the
		// fourth section.
		pairs := int32(spec.Dim / spec.Heads / 2)
		kv[arch+".rope.dimension_sections"] = []int32{pairs / 4, pairs * 3 / 8, pairs * 3 / 8, 0}
	}
	if p, ok := poolingTypes[spec.Pooling]; ok {
		kv["llama.pooling_type"] = p
		// The tokenizer ends every input with EOS, as embedding models'
		// do: last pooling reads that token.
		tokenizer["tokenizer.ggml.add_eos_token"] = true
	}
	for k, v := range tokenizer {
		kv[k] = v
	}
	return writeFile(ctx, path, kv, ts, params)
}

// writeFile writes the GGUF atomically (see Write).
func writeFile(ctx context.Context, path string, kv ggml.KV, ts []*ggml.Tensor, params uint64) (Info, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".mkgguf-*.gguf")
	if err != nil {
		return Info{}, fmt.Errorf("create output: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := ggml.WriteGGUF(tmp, kv, ts); err != nil {
		return Info{}, fmt.Errorf("write gguf: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("write gguf: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return Info{}, fmt.Errorf("write gguf: %w", err)
	}
	st, err := tmp.Stat()
	if err != nil {
		return Info{}, fmt.Errorf("write gguf: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Info{}, fmt.Errorf("write gguf: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return Info{}, fmt.Errorf("rename output: %w", err)
	}
	keep = true
	return Info{Parameters: params, Tensors: len(ts), Bytes: st.Size()}, nil
}

// vocabulary is the donor's tokens and their types.
type vocabulary struct {
	tokens []string
	types  []int32
}

// padPrefix starts the text of every token padVocab adds: a private-use
// character, which no prompt holds, so the padding never changes how text
// tokenizes, and cycle leaves those tokens out.
const padPrefix = "\ue000"

// maxVocab bounds VocabSize: the largest vocabularies in use (Gemma's) have
// about 262,000 tokens; padVocab's two-character suffix names 6400^2.
const maxVocab = 1 << 20

// padVocab appends tokens to voc until it holds size, and writes the result
// into the tokenizer metadata. The new tokens are ordinary ones whose text is
// padPrefix and two more private-use characters, scored below every other
// token. They cost what a real vocabulary's tokens cost (an embedding row, an
// output row, a logit the sampler looks at) but never win the greedy choice:
// their output rows are zero (see tensors), so their logits are 0 against the
// cycle's hundreds.
func padVocab(kv ggml.KV, voc vocabulary, size int) (vocabulary, error) {
	n := len(voc.tokens)
	if size < n {
		return voc, fmt.Errorf("vocab-size %d is below the %d tokens of the donor's vocabulary", size, n)
	}
	scores := make([]float32, size)
	copy(scores, kv.Floats("tokenizer.ggml.scores"))
	low := float32(0)
	for _, sc := range scores[:n] {
		low = min(low, sc)
	}
	const private = 0xe000 // 6400 private-use characters from here
	for i := range size - n {
		voc.tokens = append(voc.tokens, fmt.Sprintf("%s%c%c", padPrefix, rune(private+i/6400), rune(private+i%6400)))
		voc.types = append(voc.types, tokenTypeNormal)
		scores[n+i] = low - 1
	}
	kv["tokenizer.ggml.tokens"] = voc.tokens
	kv["tokenizer.ggml.token_type"] = voc.types
	kv["tokenizer.ggml.scores"] = scores
	return voc, nil
}

// readVocab returns the donor's tokenizer.* metadata (ready to write back)
// and its vocabulary.
func readVocab(path string) (ggml.KV, vocabulary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, vocabulary{}, fmt.Errorf("open vocabulary donor: %w", err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1) // -1: keep every array, the vocabulary is one
	if err != nil {
		return nil, vocabulary{}, fmt.Errorf("read vocabulary donor %s: %w", path, err)
	}
	kv := g.KV()
	out := ggml.KV{}
	for k, v := range kv {
		if strings.HasPrefix(k, "tokenizer.") {
			out[k] = v
		}
	}
	tokens := kv.Strings("tokenizer.ggml.tokens")
	types := kv.Ints("tokenizer.ggml.token_type")
	if len(tokens) == 0 {
		return nil, vocabulary{}, fmt.Errorf("vocabulary donor %s has no tokenizer.ggml.tokens", path)
	}
	if len(types) != len(tokens) {
		// Without types every token counts as normal.
		types = make([]int32, len(tokens))
		for i := range types {
			types[i] = tokenTypeNormal
		}
	}
	return out, vocabulary{tokens: tokens, types: types}, nil
}

func fileType(typ string) uint32 {
	if typ == "f16" {
		return 1 // LLAMA_FTYPE_MOSTLY_F16
	}
	return 0 // LLAMA_FTYPE_ALL_F32
}

// tensors lists the llama tensors of spec in GGUF's shape order (ne0 first:
// a weight that maps n inputs to m outputs has shape [n, m]). Norm weights are
// F32 ones, as converters write them; matrices are spec.Type.
//
// The values are chosen so that greedy decoding behaves like a language model
// that never stops: it walks a fixed random cycle through the vocabulary's
// normal tokens. A plainly random network instead collapses into repeating one
// token (the residual stream forgets the input under 30 layers of noise),
// which Ollama cuts off after 30 repeats and which is not what a benchmark
// should measure. How:
//   - token_embd rows are N(0, embdStd) with embdStd = 1, large against what
//     the layers add, so the last hidden state stays close to the embedding of
//     the current token x;
//   - q, k, v, gate and up are N(0, Std); attn_output and ffn_down, which write
//     into the residual stream, are N(0, ResidStd) with ResidStd << Std (GPT-2
//     scales these too). Compute per token does not depend on the values;
//   - output.weight row σ(x) is token_embd row x, for a random cyclic
//     permutation σ of the normal word-start tokens (see cycle), so argmax is
//     σ(x) by a wide margin; every other row is zero, so greedy decoding never
//     ends on EOS, never emits a lone byte (invalid UTF-8), and from any
//     token other than those enters the cycle at a random point.
//
// With TiedEmbeddings the output projection is token_embd itself (SmolLM2's
// exact tensor list), and greedy decoding repeats the current token.
func tensors(ctx context.Context, spec Spec, voc vocabulary, chains [][]int) []*ggml.Tensor {
	kind := uint32(ggml.TensorTypeF32)
	if spec.Type == "f16" {
		kind = uint32(ggml.TensorTypeF16)
	}
	headDim := spec.Dim / spec.Heads
	kvDim := uint64(spec.KVHeads * headDim)
	vocab := uint64(len(voc.tokens))
	dim, ffn := uint64(spec.Dim), uint64(spec.FFN)

	matrix := func(name string, in, out uint64, std float64) *ggml.Tensor {
		return &ggml.Tensor{Name: name, Kind: kind, Shape: []uint64{in, out},
			WriterTo: newRandomTensor(ctx, kind, in*out, std, spec.Seed, name)}
	}
	norm := func(name string) *ggml.Tensor {
		return &ggml.Tensor{Name: name, Kind: uint32(ggml.TensorTypeF32), Shape: []uint64{dim},
			WriterTo: &valuesTensor{kind: uint32(ggml.TensorTypeF32), values: ones(dim)}}
	}

	embd := make([]float32, vocab*dim)
	rng := rand.New(rand.NewPCG(tensorSeed(spec.Seed, "token_embd.weight")))
	for i := range embd {
		embd[i] = float32(rng.NormFloat64() * embdStd)
	}
	ts := []*ggml.Tensor{
		{Name: "token_embd.weight", Kind: kind, Shape: []uint64{dim, vocab}, WriterTo: &valuesTensor{kind: kind, values: embd}},
		norm("output_norm.weight"),
	}
	if !spec.TiedEmbeddings {
		next := cycle(spec.Seed, voc)
		for _, chain := range chains {
			for i := 0; i+1 < len(chain); i++ {
				next[chain[i]] = chain[i+1]
			}
		}
		out := make([]float32, vocab*dim)
		for x, y := range next {
			// A sum: with a script two tokens can lead to the same one (a cycle token into the reply).
			row, from := out[uint64(y)*dim:uint64(y+1)*dim], embd[uint64(x)*dim:uint64(x+1)*dim]
			for i := range row {
				row[i] += from[i]
			}
		}
		ts = append(ts, &ggml.Tensor{Name: "output.weight", Kind: kind, Shape: []uint64{dim, vocab}, WriterTo: &valuesTensor{kind: kind, values: out}})
	}
	for i := range spec.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			norm(p+"attn_norm.weight"),
			matrix(p+"attn_q.weight", dim, dim, spec.Std),
			matrix(p+"attn_k.weight", dim, kvDim, spec.Std),
			matrix(p+"attn_v.weight", dim, kvDim, spec.Std),
			matrix(p+"attn_output.weight", dim, dim, spec.ResidStd),
			norm(p+"ffn_norm.weight"),
			matrix(p+"ffn_gate.weight", dim, ffn, spec.Std),
			matrix(p+"ffn_up.weight", dim, ffn, spec.Std),
			matrix(p+"ffn_down.weight", ffn, dim, spec.ResidStd),
		)
	}
	return ts
}

// wordStart is SentencePiece's marker of a token that begins a word.
const wordStart = "\u2581"

// embdStd is the standard deviation of token embeddings (see tensors).
const embdStd = 1.0

// cycle returns σ as a map from each token of the cycle to its successor:
// one random cycle, seeded, through the normal tokens that start a word
// (SentencePiece's "▁" prefix), or through all normal tokens when fewer than
// two start one, padVocab's never. It has no fixed point.
//
// Word-start tokens make the reply tokenization-stable, as a real model's
// replies are: the reply " w1 w2 w3" tokenizes back to exactly the tokens that
// were generated (SentencePiece never merges across a space), so a server
// that renders the next turn from the reply's text finds the whole previous
// turn in its KV cache. With arbitrary tokens the text would re-tokenize
// differently and every turn would re-evaluate the previous reply, an
// artifact no real model shows.
func cycle(seed uint64, voc vocabulary) map[int]int {
	var normal, words []int
	for i, t := range voc.types {
		if t != tokenTypeNormal || strings.HasPrefix(voc.tokens[i], padPrefix) {
			continue
		}
		normal = append(normal, i)
		if strings.HasPrefix(voc.tokens[i], wordStart) && len(voc.tokens[i]) > len(wordStart) {
			words = append(words, i)
		}
	}
	if len(words) >= 2 {
		normal = words
	}
	rng := rand.New(rand.NewPCG(tensorSeed(seed, "output.weight")))
	rng.Shuffle(len(normal), func(i, j int) { normal[i], normal[j] = normal[j], normal[i] })
	next := make(map[int]int, len(normal))
	for i, x := range normal {
		next[x] = normal[(i+1)%len(normal)]
	}
	return next
}

func ones(n uint64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// tensorSeed derives a tensor's stream from the model seed and its name, so
// the bytes do not depend on the order in which WriteGGUF's goroutines run.
func tensorSeed(seed uint64, name string) (uint64, uint64) {
	h := fnv.New64a()
	h.Write([]byte(name))
	return seed, h.Sum64()
}

// chunkElems is how many elements a tensor writer converts per Write call.
const chunkElems = 1 << 16

// randomTensor writes n elements drawn from N(0, std), generated as they
// are written so that no tensor is held in memory.
type randomTensor struct {
	ctx  context.Context
	kind uint32
	n    uint64
	std  float64
	seed [2]uint64 // PCG state, from tensorSeed
}

func newRandomTensor(ctx context.Context, kind uint32, n uint64, std float64, seed uint64, name string) *randomTensor {
	s1, s2 := tensorSeed(seed, name)
	return &randomTensor{ctx: ctx, kind: kind, n: n, std: std, seed: [2]uint64{s1, s2}}
}

func (t *randomTensor) WriteTo(w io.Writer) (int64, error) {
	rng := rand.New(rand.NewPCG(t.seed[0], t.seed[1]))
	return writeValues(t.ctx, w, t.kind, t.n, func(uint64) float32 { return float32(rng.NormFloat64() * t.std) })
}

// valuesTensor writes values held in memory.
type valuesTensor struct {
	kind   uint32
	values []float32
}

func (t *valuesTensor) WriteTo(w io.Writer) (int64, error) {
	return writeValues(context.Background(), w, t.kind, uint64(len(t.values)), func(i uint64) float32 { return t.values[i] })
}

// writeValues encodes n values, value(0) first, as F16 or F32 in chunks,
// checking ctx between chunks.
func writeValues(ctx context.Context, w io.Writer, kind uint32, n uint64, value func(uint64) float32) (int64, error) {
	size := 4
	if kind == uint32(ggml.TensorTypeF16) {
		size = 2
	}
	buf := make([]byte, 0, chunkElems*size)
	var written int64
	for i := range n {
		if size == 2 {
			buf = binary.LittleEndian.AppendUint16(buf, f32ToF16(value(i)))
		} else {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(value(i)))
		}
		if len(buf) == cap(buf) || i == n-1 {
			if err := ctx.Err(); err != nil {
				return written, err
			}
			m, err := w.Write(buf)
			written += int64(m)
			if err != nil {
				return written, err
			}
			buf = buf[:0]
		}
	}
	return written, nil
}

// f32ToF16 converts to IEEE 754 half precision, rounding to nearest even,
// with subnormals, overflow to infinity, and NaN kept NaN.
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // half's biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half: m * 2^-24 with m = full * 2^(exp-126) = full >> (14-e),
		// where full is the mantissa with its implicit bit.
		if exp == 0 {
			return sign // float32 subnormals are far below half's range
		}
		shift := uint(14 - e)
		if shift > 24 {
			return sign
		}
		full := mant | 0x800000
		m := full >> shift
		rem := full & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(m)
	}
	h := sign | uint16(e)<<10 | uint16(mant>>13)
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // carries into the exponent (and to Inf) correctly
	}
	return h
}
