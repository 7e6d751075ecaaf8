package llm_test

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/llm/offload"
)

// TestDeviceWithoutGPU: these machines have no GPU (and the test binary no
// lib/ollama beside it), so --gpu-layers auto must land on the CPU, say so
// in Info, resolve flash attention "auto" to the CPU's choice (off), and
// generate.
func TestDeviceWithoutGPU(t *testing.T) {
	for _, layers := range []int{offload.Auto, 0, 99} {
		e := mustOpen(t, llm.Config{ContextLength: 128, Parallel: 2, GPULayers: layers, FlashAttention: "auto"})
		d := e.Info().Device
		if d.Type != "cpu" || d.Backend != "CPU" || d.LayersOffloaded != 0 || d.GPULayers != 0 {
			t.Errorf("gpu layers %d: device %+v, want the CPU with nothing offloaded", layers, d)
		}
		if d.LayersTotal != e.Info().Layers+1 {
			t.Errorf("layers total %d, want blocks + output head = %d", d.LayersTotal, e.Info().Layers+1)
		}
		if d.FlashAttention || d.KVUnified {
			t.Errorf("gpu layers %d: flash attention %v, kv unified %v on the CPU; want both off (auto, default)", layers, d.FlashAttention, d.KVUnified)
		}
		if r := generate(t, e, "", "Once upon a time", greedy(8)); len(r.ids) == 0 {
			t.Errorf("gpu layers %d: no tokens generated on the CPU", layers)
		}
		st := e.Stats()
		if st.DeviceMemoryUsed != 0 || st.DeviceMemoryTotal != 0 {
			t.Errorf("device memory on the CPU reported as %d of %d; want none", st.DeviceMemoryUsed, st.DeviceMemoryTotal)
		}
	}
	if _, err := llm.Open(llm.Config{Path: testmodel.Path(t), GPULayers: -2}); err == nil || !strings.Contains(err.Error(), "gpu layers") {
		t.Errorf("GPULayers -2: error %v, want a gpu layers error", err)
	}
	if _, err := llm.Open(llm.Config{Path: testmodel.Path(t), KVUnified: "maybe"}); err == nil || !strings.Contains(err.Error(), "kv unified") {
		t.Errorf("KVUnified maybe: error %v, want a kv unified error", err)
	}
}

// TestKVUnified: the shared KV buffer (set through the mirrored context
// parameters) is really in use when asked for, and greedy replies of
// several sessions are the same with it as with one stream per slot, turn
// after turn (the slots' caches are reused), and sessions decoding together
// all get replies.
func TestKVUnified(t *testing.T) {
	run := func(mode string) [][]int {
		e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 3, KVUnified: mode})
		if got := e.Info().Device.KVUnified; got != (mode == "on") {
			t.Fatalf("kv unified %s: Info says %v (the context parameters mirror did not match the binding?)", mode, got)
		}
		// One after another: batching several sequences may change the
		// float rounding, which is not what this compares.
		var out [][]int
		for turn := range 2 {
			for i := range 3 {
				prompt := strings.Repeat("Once upon a time there was a cat. ", turn+1) + []string{"Lily", "Tom", "Sam"}[i]
				out = append(out, generate(t, e, []string{"a", "b", "c"}[i], prompt, greedy(12+4*i)).ids)
			}
		}
		// And together: every session gets a reply.
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := generate(t, e, []string{"a", "b", "c"}[i], "Tom and Lily", greedy(8)); len(r.ids) == 0 {
					t.Errorf("kv unified %s: session %d got no tokens decoding together", mode, i)
				}
			}()
		}
		wg.Wait()
		return out
	}
	streams, unified := run("off"), run("on")
	for i := range streams {
		if len(streams[i]) == 0 || !slices.Equal(streams[i], unified[i]) {
			t.Errorf("reply %d: streams %v, unified %v", i, streams[i], unified[i])
		}
	}
}
