package llm

import (
	"testing"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// The device id placeModel gives llama.cpp is the GPU's position in the
// list, also for the current engine, whose devices carry no ggml pointer
// (dev is nil for every one of them, so comparing pointers matched each).
func TestPlaceModelDeviceIndex(t *testing.T) {
	const gib = 1 << 30
	ds := []device{
		{name: "CPU", description: "host", free: 8 * gib, total: 16 * gib},
		{name: "CUDA0", description: "first GPU", gpu: true, free: 40 * gib, total: 80 * gib},
		{name: "CUDA1", description: "second GPU", gpu: true, free: 40 * gib, total: 80 * gib},
	}
	cfg := Config{GPULayers: 4, ContextLength: 256, CacheSlots: 1, BatchSize: 32, KVCacheType: "f16"}
	meta := metadata{info: parley.ModelInfo{Layers: 2}}
	p, err := placeModel(cfg, meta, ds, "", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if p.index != 1 || p.dev.name != "CUDA0" {
		t.Errorf("placed on device %d (%s), want 1 (CUDA0)", p.index, p.dev.name)
	}
	if p.info.Type == "cpu" || p.info.LayersOffloaded != 3 {
		t.Errorf("placement %+v, want all 3 layers on the GPU", p.info)
	}
}
