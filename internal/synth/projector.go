package synth

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ollama/ollama/fs/ggml"
)

// ProjectorSpec is the shape of a synthetic vision projector (an "mmproj" GGUF, llama.cpp's clip architecture):
// a small ViT (patch embedding, position embeddings, pre-norm transformer blocks) and LLaVA's two-layer MLP
// projector (clip.projector_type "mlp") into the text model's embedding space. llama.cpp's libmtmd loads it beside
// any text model whose embedding length is ProjDim, so that tests run an image through the very code paths a real
// LLaVA model takes, with weights small enough to write in milliseconds. Its output means nothing; what matters is
// that it is deterministic, and that different pixels give different embeddings (random weights do).
type ProjectorSpec struct {
	ImageSize int // the ViT's input side, in pixels (images are resized to it)
	PatchSize int // ImageSize % PatchSize == 0
	Dim       int // the ViT's embedding length
	Heads     int // Dim % Heads == 0
	FFN       int // the ViT's feed-forward length (not Dim: llama.cpp would read the FFN as swapped)
	Layers    int // ViT blocks; LLaVA takes the features of the last but one, so at least 2
	Hidden    int // the projector MLP's hidden width
	ProjDim   int // the text model's embedding length
	Std       float64
	Seed      uint64
	// Type is the projector: "" or "mlp" (LLaVA's, above), or "qwen2vl_merger" (Qwen2-VL's: two patch convolutions
	// summed, no position embeddings but M-RoPE over the patches inside the ViT, and an MLP over each 2x2 block of
	// patches). libmtmd places a Qwen2-VL image's embeddings with M-RoPE positions: a grid of nx by ny embeddings
	// takes max(nx, ny) positions of the text model, which must be of a qwen2vl architecture (QwenVLSpec).
	Type string
}

// Projector types of ProjectorSpec.Type.
const (
	ProjectorMLP     = "mlp"
	ProjectorQwen2VL = "qwen2vl_merger"
)

// QwenVLProjector fits QwenVLSpec (embedding length 64): 8x8 patches merged 2x2, so that an image of 48x48 pixels is
// 3x3 embeddings at 3 positions.
func QwenVLProjector() ProjectorSpec {
	return ProjectorSpec{ImageSize: 32, PatchSize: 8, Dim: 32, Heads: 4, FFN: 48, Layers: 2, Hidden: 64, ProjDim: 64, Std: 0.2, Seed: 1,
		Type: ProjectorQwen2VL}
}

// DefaultProjector fits stories260K (embedding length 64): 32x32 images in 16 patches of 8x8.
func DefaultProjector() ProjectorSpec {
	return ProjectorSpec{ImageSize: 32, PatchSize: 8, Dim: 32, Heads: 4, FFN: 48, Layers: 2, Hidden: 64, ProjDim: 64, Std: 0.2, Seed: 1}
}

func (p ProjectorSpec) validate() error {
	switch {
	case p.ImageSize <= 0 || p.PatchSize <= 0 || p.ImageSize%p.PatchSize != 0:
		return fmt.Errorf("image size %d is not a multiple of the patch size %d", p.ImageSize, p.PatchSize)
	case p.Dim <= 0 || p.Heads <= 0 || p.Dim%p.Heads != 0:
		return fmt.Errorf("dim %d is not a multiple of %d heads", p.Dim, p.Heads)
	case p.FFN <= 0 || p.FFN == p.Dim:
		return fmt.Errorf("ffn %d must be positive and differ from dim", p.FFN)
	case p.Type != "" && p.Type != ProjectorMLP && p.Type != ProjectorQwen2VL:
		return fmt.Errorf("projector type %q: want %s or %s", p.Type, ProjectorMLP, ProjectorQwen2VL)
	case p.Type == ProjectorQwen2VL && (p.Dim/p.Heads)%4 != 0:
		return fmt.Errorf("head size %d: Qwen2-VL's ViT splits it into four M-RoPE sections", p.Dim/p.Heads)
	case p.Layers < 2:
		return fmt.Errorf("%d layers: LLaVA reads the last but one, so at least 2", p.Layers)
	case p.Hidden <= 0 || p.ProjDim <= 0:
		return fmt.Errorf("hidden %d and projection dim %d must be positive", p.Hidden, p.ProjDim)
	}
	return nil
}

// WriteProjector writes the projector p describes to path (through a temporary file in the same folder).
func WriteProjector(ctx context.Context, path string, p ProjectorSpec) error {
	if err := p.validate(); err != nil {
		return fmt.Errorf("projector spec: %w", err)
	}
	f32 := uint32(ggml.TensorTypeF32)
	dim, ffn, hidden, proj := uint64(p.Dim), uint64(p.FFN), uint64(p.Hidden), uint64(p.ProjDim)
	patch := uint64(p.PatchSize)
	patches := uint64(p.ImageSize/p.PatchSize) * uint64(p.ImageSize/p.PatchSize)
	random := func(name string, std float64, shape ...uint64) *ggml.Tensor {
		n := uint64(1)
		for _, s := range shape {
			n *= s
		}
		return &ggml.Tensor{Name: name, Kind: f32, Shape: shape, WriterTo: newRandomTensor(ctx, f32, n, std, p.Seed, name)}
	}
	constant := func(name string, v float32, n uint64) *ggml.Tensor {
		values := make([]float32, n)
		for i := range values {
			values[i] = v
		}
		return &ggml.Tensor{Name: name, Kind: f32, Shape: []uint64{n}, WriterTo: &valuesTensor{kind: f32, values: values}}
	}
	qwen := p.Type == ProjectorQwen2VL
	var ts []*ggml.Tensor
	if qwen {
		// Two convolutions over the image (one per frame of a two-frame video; a still image goes through both),
		// summed; no bias and no position embeddings: the ViT's attention places patches by M-RoPE.
		ts = append(ts,
			random("v.patch_embd.weight", p.Std, patch, patch, 3, dim),
			random("v.patch_embd.weight.1", p.Std, patch, patch, 3, dim))
	} else {
		ts = append(ts,
			// ggml's order: kernel width, height, input channels, output channels.
			random("v.patch_embd.weight", p.Std, patch, patch, 3, dim),
			random("v.patch_embd.bias", p.Std, dim),
			random("v.position_embd.weight", p.Std, dim, patches))
	}
	for i := range p.Layers {
		b := fmt.Sprintf("v.blk.%d.", i)
		ts = append(ts,
			constant(b+"ln1.weight", 1, dim), constant(b+"ln1.bias", 0, dim),
			random(b+"attn_q.weight", p.Std, dim, dim), random(b+"attn_q.bias", p.Std, dim),
			random(b+"attn_k.weight", p.Std, dim, dim), random(b+"attn_k.bias", p.Std, dim),
			random(b+"attn_v.weight", p.Std, dim, dim), random(b+"attn_v.bias", p.Std, dim),
			random(b+"attn_out.weight", p.Std, dim, dim), random(b+"attn_out.bias", p.Std, dim),
			constant(b+"ln2.weight", 1, dim), constant(b+"ln2.bias", 0, dim),
			random(b+"ffn_up.weight", p.Std, dim, ffn), random(b+"ffn_up.bias", p.Std, ffn),
			random(b+"ffn_down.weight", p.Std, ffn, dim), random(b+"ffn_down.bias", p.Std, dim),
		)
	}
	mmIn := dim
	if qwen {
		mmIn = 4 * dim // the merger's MLP reads each 2x2 block of patches as one vector
	}
	ts = append(ts,
		random("mm.0.weight", p.Std, mmIn, hidden), random("mm.0.bias", p.Std, hidden),
		// The text model's embeddings are of order 1 (stories260K's too): the projector's output is scaled alike.
		random("mm.2.weight", 1, hidden, proj), random("mm.2.bias", 0.1, proj),
	)
	kv := ggml.KV{
		"general.architecture":                     "clip",
		"general.name":                             "parley-synthetic-projector",
		"general.file_type":                        uint32(0), // F32
		"clip.projector_type":                      "mlp",
		"clip.has_vision_encoder":                  true,
		"clip.use_gelu":                            true,
		"clip.vision.image_size":                   uint32(p.ImageSize),
		"clip.vision.patch_size":                   uint32(p.PatchSize),
		"clip.vision.embedding_length":             uint32(p.Dim),
		"clip.vision.feed_forward_length":          uint32(p.FFN),
		"clip.vision.block_count":                  uint32(p.Layers),
		"clip.vision.projection_dim":               uint32(p.ProjDim),
		"clip.vision.attention.head_count":         uint32(p.Heads),
		"clip.vision.attention.layer_norm_epsilon": float32(1e-6),
		"clip.vision.image_mean":                   []float32{0.5, 0.5, 0.5},
		"clip.vision.image_std":                    []float32{0.5, 0.5, 0.5},
	}
	if qwen {
		kv["clip.projector_type"] = ProjectorQwen2VL
		kv["clip.vision.spatial_merge_size"] = uint32(2)
		delete(kv, "clip.use_gelu") // Qwen2-VL's ViT uses QuickGELU, llama.cpp's default
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".mkgguf-*.gguf")
	if err != nil {
		return fmt.Errorf("create output: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, there is nothing there to remove
	if err := ggml.WriteGGUF(tmp, kv, ts); err != nil {
		tmp.Close()
		return fmt.Errorf("write projector: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write projector: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename output: %w", err)
	}
	return nil
}
