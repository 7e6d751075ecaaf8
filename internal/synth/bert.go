package synth

import (
	"context"
	"fmt"

	"github.com/ollama/ollama/fs/ggml"
)

// poolingTypes maps Spec.Pooling to llama.cpp's enum llama_pooling_type.
var poolingTypes = map[string]uint32{"mean": 1, "cls": 2, "last": 3, "rank": 4}

// writeBERT writes an encoder in llama.cpp's bert architecture: learned
// positions, post-norm blocks (LayerNorm with bias) of attention and a GELU
// feed-forward, non-causal attention, and the pooling spec.Pooling names.
// With rank it is a reranker: BERT's classifier head (cls: dim to dim, tanh;
// cls.output: dim to one score) over the first token. The vocabulary is the
// donor's, which ends every input with EOS and uses EOS as SEP, as
// RoBERTa-style rerankers do: a (query, document) pair is then
// BOS query EOS SEP document EOS.
//
// Weights are seeded random: q, k, v, ffn_up N(0, Std), attn_output and
// ffn_down N(0, ResidStd), embeddings N(0, 1), norms one; the blocks'
// biases are zero (the embedded engine's llama.cpp requires them), the
// classifier's N(0, Std). What the vectors mean does not
// matter; that two engines compute the same ones does.
func writeBERT(ctx context.Context, path string, spec Spec, tokenizer ggml.KV, voc vocabulary) (Info, error) {
	ts := bertTensors(ctx, spec, uint64(len(voc.tokens)))
	var params uint64
	for _, t := range ts {
		params += t.Elements()
	}
	kv := ggml.KV{
		"general.architecture":              "bert",
		"general.name":                      spec.Name,
		"general.description":               spec.Description(),
		"general.file_type":                 fileType(spec.Type),
		"general.parameter_count":           params,
		"bert.block_count":                  uint32(spec.Layers),
		"bert.context_length":               uint32(spec.Context),
		"bert.embedding_length":             uint32(spec.Dim),
		"bert.feed_forward_length":          uint32(spec.FFN),
		"bert.attention.head_count":         uint32(spec.Heads),
		"bert.attention.layer_norm_epsilon": float32(spec.RMSEps),
		"bert.attention.causal":             false,
		"bert.pooling_type":                 poolingTypes[spec.Pooling],
		"tokenizer.ggml.token_type_count":   uint32(2),
		"tokenizer.ggml.add_eos_token":      true,
		"tokenizer.ggml.add_sep_token":      spec.Pooling == "rank",
		"tokenizer.ggml.seperator_token_id": tokenizer.Uint("tokenizer.ggml.eos_token_id"),
	}
	for k, v := range tokenizer {
		if _, set := kv[k]; !set {
			kv[k] = v
		}
	}
	return writeFile(ctx, path, kv, ts, params)
}

// bertTensors lists the bert tensors of spec (GGUF shape order, as tensors).
func bertTensors(ctx context.Context, spec Spec, vocab uint64) []*ggml.Tensor {
	kind := uint32(ggml.TensorTypeF32)
	if spec.Type == "f16" {
		kind = uint32(ggml.TensorTypeF16)
	}
	dim, ffn := uint64(spec.Dim), uint64(spec.FFN)
	f32 := uint32(ggml.TensorTypeF32)
	random := func(name string, k uint32, std float64, shape ...uint64) *ggml.Tensor {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		return &ggml.Tensor{Name: name, Kind: k, Shape: shape, WriterTo: newRandomTensor(ctx, k, n, std, spec.Seed, name)}
	}
	fill := func(name string, n uint64, v float32) *ggml.Tensor {
		vals := make([]float32, n)
		for i := range vals {
			vals[i] = v
		}
		return &ggml.Tensor{Name: name, Kind: f32, Shape: []uint64{n}, WriterTo: &valuesTensor{kind: f32, values: vals}}
	}
	ts := []*ggml.Tensor{
		random("token_embd.weight", kind, embdStd, dim, vocab),
		random("token_types.weight", f32, embdStd, dim, 2),
		random("position_embd.weight", f32, embdStd, dim, uint64(spec.Context)),
		fill("token_embd_norm.weight", dim, 1),
		fill("token_embd_norm.bias", dim, 0),
	}
	if spec.Pooling == "rank" {
		ts = append(ts,
			random("cls.weight", kind, spec.Std*4, dim, dim),
			random("cls.bias", f32, spec.Std, dim),
			random("cls.output.weight", f32, 1, dim, 1),
			random("cls.output.bias", f32, spec.Std, 1),
		)
	}
	for i := range spec.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			random(p+"attn_q.weight", kind, spec.Std, dim, dim),
			fill(p+"attn_q.bias", dim, 0),
			random(p+"attn_k.weight", kind, spec.Std, dim, dim),
			fill(p+"attn_k.bias", dim, 0),
			random(p+"attn_v.weight", kind, spec.Std, dim, dim),
			fill(p+"attn_v.bias", dim, 0),
			random(p+"attn_output.weight", kind, spec.ResidStd, dim, dim),
			fill(p+"attn_output.bias", dim, 0),
			fill(p+"attn_output_norm.weight", dim, 1),
			fill(p+"attn_output_norm.bias", dim, 0),
			random(p+"ffn_up.weight", kind, spec.Std, dim, ffn),
			fill(p+"ffn_up.bias", ffn, 0),
			random(p+"ffn_down.weight", kind, spec.ResidStd, ffn, dim),
			fill(p+"ffn_down.bias", dim, 0),
			fill(p+"layer_output_norm.weight", dim, 1),
			fill(p+"layer_output_norm.bias", dim, 0),
		)
	}
	return ts
}
