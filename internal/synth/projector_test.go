package synth

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
)

// The projector has what llama.cpp's clip loader reads for a LLaVA MLP projector, in the shapes it reads, and the
// same spec writes the same bytes.
func TestWriteProjector(t *testing.T) {
	dir := t.TempDir()
	p := DefaultProjector()
	a, b := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf")
	for _, path := range []string{a, b} {
		if err := WriteProjector(context.Background(), path, p); err != nil {
			t.Fatal(err)
		}
	}
	if fileHash(t, a) != fileHash(t, b) {
		t.Error("the same spec wrote different bytes")
	}
	g := decode(t, a)
	kv := g.KV()
	// (KV's getters put the architecture before a key: these are read as stored.)
	if kv.Architecture() != "clip" || kv["clip.projector_type"] != "mlp" || kv["clip.has_vision_encoder"] != true ||
		kv["clip.vision.projection_dim"] != uint32(64) || kv["clip.vision.image_size"] != uint32(32) {
		t.Errorf("metadata %v", kv)
	}
	shapes := map[string][]uint64{
		"v.patch_embd.weight":     {8, 8, 3, 32},
		"v.position_embd.weight":  {32, 16},
		"v.blk.1.ffn_down.weight": {48, 32},
		"mm.0.weight":             {32, 64},
		"mm.2.weight":             {64, 64},
	}
	for _, tn := range g.Tensors().Items() {
		if want, ok := shapes[tn.Name]; ok {
			if !slices.Equal(tn.Shape, want) {
				t.Errorf("%s: shape %v, want %v", tn.Name, tn.Shape, want)
			}
			delete(shapes, tn.Name)
		}
	}
	if len(shapes) > 0 {
		t.Errorf("missing tensors %v", shapes)
	}
	bad := p
	bad.FFN = bad.Dim
	if err := WriteProjector(context.Background(), filepath.Join(dir, "c.gguf"), bad); err == nil {
		t.Error("an FFN as wide as the ViT was written (llama.cpp would swap it)")
	}
}

// A Qwen2-VL pair: the projector has the merger's tensors (two patch convolutions, no position embeddings, an MLP
// over four patches at once), the text model the qwen2vl architecture with M-RoPE sections that add up to half a
// head and the vision tokens libmtmd wraps an image in.
func TestWriteQwenVLPair(t *testing.T) {
	dir := t.TempDir()
	proj := filepath.Join(dir, "mmproj.gguf")
	if err := WriteProjector(context.Background(), proj, QwenVLProjector()); err != nil {
		t.Fatal(err)
	}
	g := decode(t, proj)
	if kv := g.KV(); kv["clip.projector_type"] != ProjectorQwen2VL || kv["clip.use_gelu"] != nil {
		t.Errorf("projector metadata %v", kv)
	}
	shapes := map[string][]uint64{
		"v.patch_embd.weight":   {8, 8, 3, 32},
		"v.patch_embd.weight.1": {8, 8, 3, 32},
		"mm.0.weight":           {128, 64},
		"mm.2.weight":           {64, 64},
	}
	for _, tn := range g.Tensors().Items() {
		if tn.Name == "v.position_embd.weight" || tn.Name == "v.patch_embd.bias" {
			t.Errorf("%s: Qwen2-VL's ViT has none", tn.Name)
		}
		if want, ok := shapes[tn.Name]; ok {
			if !slices.Equal(tn.Shape, want) {
				t.Errorf("%s: shape %v, want %v", tn.Name, tn.Shape, want)
			}
			delete(shapes, tn.Name)
		}
	}
	if len(shapes) > 0 {
		t.Errorf("missing tensors %v", shapes)
	}

	model := filepath.Join(dir, "qwen.gguf")
	if _, err := Write(context.Background(), model, QwenVLSpec(donor(t))); err != nil {
		t.Fatal(err)
	}
	kv := decode(t, model).KV()
	if kv.Architecture() != ArchQwen2VL || kv["qwen2vl.embedding_length"] != uint32(64) {
		t.Errorf("model metadata: architecture %q, embedding length %v", kv.Architecture(), kv["qwen2vl.embedding_length"])
	}
	sections := kv.Ints("rope.dimension_sections")
	sum := 0
	for _, s := range sections {
		sum += int(s)
	}
	if len(sections) != 4 || sections[0] == 0 || sections[1] == 0 || sum != 16/2 {
		t.Errorf("rope sections %v: want four, the first two set, adding up to half the head of 16", sections)
	}
	tokens, types := kv.Strings("tokenizer.ggml.tokens"), kv.Ints("tokenizer.ggml.token_type")
	for _, want := range []string{"<|vision_start|>", "<|vision_end|>"} {
		i := slices.Index(tokens, want)
		if i < 0 || types[i] != tokenTypeControl {
			t.Errorf("%s: not a control token of the vocabulary", want)
		}
	}
}
