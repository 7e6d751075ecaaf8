package offload_test

import (
	"strings"
	"testing"

	"github.com/parley-chat/parley/llm/offload"
)

const (
	mib = offload.MiB
	gib = 1024 * mib
)

// oneB is a Llama-3.2-1B-shaped F16 model with a 512-token vocabulary
// (what tools/mkgguf writes for the GPU benchmark): 16 blocks of about
// 116 MiB, 64 sessions of 2048 tokens of f16 KV cache (8 KV heads of 64).
func oneB() offload.Model {
	layers := make([]uint64, 16)
	for i := range layers {
		layers[i] = 116 * mib
	}
	return offload.Model{
		Layers:          16,
		LayerBytes:      layers,
		OutputBytes:     2 * mib,
		KVBytesPerLayer: 64 * 2048 * (512 + 512) * 2, // 256 MiB
		ComputeBytes:    300 * mib,
	}
}

func TestFit(t *testing.T) {
	uneven := oneB()
	uneven.LayerBytes[15] = 4 * gib // the last block is huge: nothing fits from the back
	for _, tc := range []struct {
		name   string
		m      offload.Model
		free   uint64
		layers int
		reason string
	}{
		{"h100 holds everything", oneB(), 79 * gib, 17, "all 16 blocks and the output head fit"},
		// 16 x (116+256) = 5952 MiB + 2 + 300 compute; margin 512 MiB (5% of 6.5 GiB is less).
		{"exactly enough", oneB(), (5952 + 2 + 300 + 512) * mib, 17, "all 16 blocks"},
		{"one MiB short of the head", oneB(), (5952 + 2 + 300 + 512 - 1) * mib, 16, "16 of 16 blocks fit"},
		// 4 GiB free: margin 512 MiB, compute 300: 3284 MiB for blocks of 372 MiB -> 8.
		{"half fits", oneB(), 4 * gib, 8, "8 of 16 blocks fit"},
		{"compute buffers do not fit", oneB(), 700 * mib, 0, "not above the 512 MiB margin plus 300 MiB"},
		{"one block does not fit", oneB(), 1000 * mib, 0, "not even one block"},
		{"no free memory", oneB(), 0, 0, "not above"},
		{"uneven blocks stop at the first that does not fit", uneven, 4 * gib, 0, "not even one block"},
		{"no layers", offload.Model{}, 80 * gib, 0, "no layers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := offload.Fit(tc.m, tc.free)
			if p.Layers != tc.layers {
				t.Fatalf("Fit: %d layers, want %d (%s)", p.Layers, tc.layers, p.Reason)
			}
			if !strings.Contains(p.Reason, tc.reason) {
				t.Errorf("reason %q does not say %q", p.Reason, tc.reason)
			}
			if p.Layers > 0 {
				if p.Bytes != offload.Need(tc.m, p.Layers) {
					t.Errorf("plan bytes %d, Need says %d", p.Bytes, offload.Need(tc.m, p.Layers))
				}
				if p.Bytes+offload.Margin(tc.free) > tc.free {
					t.Errorf("plan uses %d MiB of %d MiB free with a %d MiB margin", p.Bytes/mib, tc.free/mib, offload.Margin(tc.free)/mib)
				}
			}
			// One more layer must not have fitted.
			if p.Layers <= tc.m.Layers && tc.m.Layers > 0 && offload.Need(tc.m, p.Layers+1)+offload.Margin(tc.free) <= tc.free {
				t.Errorf("%d layers chosen but %d fit", p.Layers, p.Layers+1)
			}
		})
	}
}

func TestMargin(t *testing.T) {
	if got := offload.Margin(2 * gib); got != 512*mib {
		t.Errorf("Margin(2 GiB) = %d MiB, want the 512 MiB floor", got/mib)
	}
	if got := offload.Margin(80 * gib); got != 4*gib {
		t.Errorf("Margin(80 GiB) = %d MiB, want 5%% (4096 MiB)", got/mib)
	}
}

func TestNeed(t *testing.T) {
	m := oneB()
	if got := offload.Need(m, 0); got != 0 {
		t.Errorf("Need(0) = %d, want 0 (no compute buffer without offload)", got)
	}
	if got, want := offload.Need(m, 1), uint64(116+256+300)*mib; got != want {
		t.Errorf("Need(1) = %d MiB, want %d", got/mib, want/mib)
	}
	if got, want := offload.Need(m, 17), uint64(16*(116+256)+2+300)*mib; got != want {
		t.Errorf("Need(17) = %d MiB, want %d (blocks, head and compute)", got/mib, want/mib)
	}
	if offload.Need(m, 99) != offload.Need(m, 17) {
		t.Error("Need past Layers+1 should count every layer once")
	}
}

func TestComputeEstimate(t *testing.T) {
	s := offload.Shape{Embedding: 2048, FeedForward: 8192, Heads: 32, Vocab: 512, MicroBatch: 512, ContextPerSeq: 2048}
	fa := s
	fa.FlashAttention = true
	off, on := offload.ComputeEstimate(s), offload.ComputeEstimate(fa)
	// Attention scores: 2 x 512 x 32 x 2048 x 4 bytes = 256 MiB, x1.5.
	if d := off - on; d != 384*mib {
		t.Errorf("flash attention off adds %d MiB, want 384 (scores over the context)", d/mib)
	}
	// Activations: 512 x (8x2048 + 3x8192 + 512) x 4 bytes = 81 MiB, x1.5.
	if on < 100*mib || on > 150*mib {
		t.Errorf("estimate with flash attention %d MiB, want about 122", on/mib)
	}
	longer := s
	longer.ContextPerSeq *= 4
	if offload.ComputeEstimate(longer) <= off {
		t.Error("a longer context must need a larger compute buffer without flash attention")
	}
}
