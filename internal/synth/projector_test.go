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
