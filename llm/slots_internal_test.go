package llm

import (
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
)

// The copy threshold follows what a copy moves: a slot's whole KV stream,
// which grows with --ctx, against what a prompt token costs, which grows
// with the model and the threads. The figures are the synthetic 135M shape
// of the measurements in slots.go.
func TestCopyThreshold(t *testing.T) {
	meta := metadata{info: parley.ModelInfo{Parameters: 106_793_280, Layers: 30}, headsKV: 3, headK: 64, headV: 64}
	cpu := parley.Device{Type: "cpu"}
	for _, c := range []struct {
		name    string
		ctx     int
		threads int
		kv      string
		dev     parley.Device
		want    int
	}{
		{"2,048 tokens per slot: a copy costs under 8 tokens", 2048, 2, "f16", cpu, minCopyPrefixCPU},
		{"32,768 tokens per slot, 2 threads", 32768, 2, "f16", cpu, 78}, // measured break-even: 62
		{"32,768 tokens per slot, 1 thread", 32768, 1, "f16", cpu, 39},  // measured: 42
		{"8,192 tokens per slot, 2 threads", 8192, 2, "f16", cpu, 20},   // measured: 14
		{"a q8_0 cache moves about half", 32768, 2, "q8_0", cpu, 42},    // 34 bytes per 32 values
		{"one unified buffer moves no data", 32768, 2, "f16", parley.Device{Type: "cpu", KVUnified: true}, minCopyPrefixCPU},
		{"the cache on a GPU", 32768, 2, "f16", parley.Device{Type: "gpu", LayersOffloaded: 31}, minCopyPrefixGPU},
		{"every repeating layer on a GPU, the output layer not", 32768, 2, "f16", parley.Device{Type: "gpu", LayersOffloaded: 30}, minCopyPrefixGPU},
		// 20 of 30 layers offloaded: the 10 left copy a third of the KV cache
		// and evaluate about a third of the prompt's FLOPs on the CPU.
		{"partly offloaded: the CPU's break-even", 32768, 2, "f16", parley.Device{Type: "gpu", LayersOffloaded: 20}, 78},
		{"partly offloaded, short slots", 2048, 2, "f16", parley.Device{Type: "gpu", LayersOffloaded: 20}, minCopyPrefixCPU},
	} {
		cfg := Config{ContextLength: c.ctx, Threads: c.threads, KVCacheType: c.kv}
		if got := copyThreshold(cfg, meta, c.dev); got != c.want {
			t.Errorf("%s: threshold %d, want %d", c.name, got, c.want)
		}
	}

	// A GGUF's own figures: stories260K (260K parameters, 5 layers) at
	// 512 tokens per slot and one thread stays at the floor.
	real, err := readMetadata(testmodel.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := copyThreshold(Config{ContextLength: 512, Threads: 1, KVCacheType: "f16"}, real, parley.Device{Type: "cpu"}); got != minCopyPrefixCPU {
		t.Errorf("stories260K: threshold %d, want %d (%+v)", got, minCopyPrefixCPU, real.info)
	}
}
