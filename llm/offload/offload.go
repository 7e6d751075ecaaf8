// Package offload decides how many of a model's layers go to a GPU: given the
// model's sizes, the KV cache the server will allocate and the device's free
// memory, it picks the most layers that fit with a safety margin. It is pure
// arithmetic (no cgo, no device): the llm package measures, this package
// decides, and its tests run on given memory figures.
//
// Layer numbering follows llama.cpp's n_gpu_layers: a model with L repeating
// blocks has L+1 offloadable layers, the blocks and then the output head
// (output norm and projection). Offloading N layers puts the last N blocks
// on the device, and the output head too when N = L+1. The token embeddings
// always stay in host memory (llama.cpp reads them row by row).
package offload

import "fmt"

// Auto is the GPULayers value that asks Fit to choose.
const Auto = -1

// MiB is a mebibyte, for sizes in this package's messages and tests.
const MiB = 1 << 20

// Model is what offloading a model costs, in bytes of device memory.
type Model struct {
	Layers      int      // repeating blocks (llama.cpp's n_layer)
	LayerBytes  []uint64 // weights of each block, len Layers (block i at index i)
	OutputBytes uint64   // output norm and projection (the token embeddings when the projection is tied)
	// KVBytesPerLayer is one block's share of the KV cache for every
	// session together: parallel x context x (K + V values per token) x
	// bytes per value. The cache of a block lives where the block does.
	KVBytesPerLayer uint64
	// ComputeBytes is the device's compute buffer (activations and
	// attention scores of the largest micro-batch), needed as soon as
	// anything is offloaded. See ComputeEstimate.
	ComputeBytes uint64
}

// Plan is Fit's answer.
type Plan struct {
	Layers int    // n_gpu_layers to ask llama.cpp for: 0..Model.Layers+1
	Bytes  uint64 // device memory the plan expects to use (weights, KV cache, compute buffers)
	Reason string // one sentence for the log: why this many
}

// Margin is the memory Fit leaves free: 5% of the device's free memory but
// at least 512 MiB, for the CUDA context, cuBLAS workspaces and the
// allocator's fragmentation, which the estimate does not count.
func Margin(free uint64) uint64 { return max(512*MiB, free/20) }

// Fit picks the most layers of m whose weights, KV cache and compute
// buffers fit in free bytes of device memory less Margin(free). It fills
// from the last block backwards, the order llama.cpp offloads in; when
// every block fits it offloads the output head too (Layers+1).
func Fit(m Model, free uint64) Plan {
	if m.Layers <= 0 {
		return Plan{Reason: "the model reports no layers"}
	}
	margin := Margin(free)
	if free <= margin+m.ComputeBytes {
		return Plan{Reason: fmt.Sprintf("%s free on the device is not above the %s margin plus %s of compute buffers",
			mib(free), mib(margin), mib(m.ComputeBytes))}
	}
	budget := free - margin - m.ComputeBytes
	used := uint64(0)
	n := 0
	for i := m.Layers - 1; i >= 0; i-- {
		need := m.KVBytesPerLayer
		if i < len(m.LayerBytes) {
			need += m.LayerBytes[i]
		}
		if used+need > budget {
			break
		}
		used += need
		n++
	}
	switch {
	case n == m.Layers && used+m.OutputBytes <= budget:
		used += m.OutputBytes
		return Plan{Layers: m.Layers + 1, Bytes: used + m.ComputeBytes, Reason: fmt.Sprintf(
			"all %d blocks and the output head fit: %s of weights and KV cache plus %s of compute buffers in %s free (margin %s)",
			m.Layers, mib(used), mib(m.ComputeBytes), mib(free), mib(margin))}
	case n == 0:
		return Plan{Reason: fmt.Sprintf("not even one block (%s with its KV cache) fits in %s free after the %s margin and %s of compute buffers",
			mib(firstNeed(m)), mib(free), mib(margin), mib(m.ComputeBytes))}
	}
	return Plan{Layers: n, Bytes: used + m.ComputeBytes, Reason: fmt.Sprintf(
		"%d of %d blocks fit (%s of weights and KV cache plus %s of compute buffers in %s free, margin %s); the rest run on the CPU",
		n, m.Layers, mib(used), mib(m.ComputeBytes), mib(free), mib(margin))}
}

// Need is what offloading n layers of m uses on the device (the figure Fit
// compares with free memory less the margin), for an explicit --gpu-layers.
func Need(m Model, n int) uint64 {
	if n <= 0 || m.Layers <= 0 {
		return 0
	}
	total := m.ComputeBytes
	for i := m.Layers - 1; i >= max(0, m.Layers-n); i-- {
		total += m.KVBytesPerLayer
		if i < len(m.LayerBytes) {
			total += m.LayerBytes[i]
		}
	}
	if n > m.Layers {
		total += m.OutputBytes
	}
	return total
}

func firstNeed(m Model) uint64 {
	need := m.KVBytesPerLayer
	if len(m.LayerBytes) >= m.Layers {
		need += m.LayerBytes[m.Layers-1]
	}
	return need
}

// Shape is what ComputeEstimate needs to know about the model and the context.
type Shape struct {
	Embedding      int  // n_embd
	FeedForward    int  // n_ff
	Heads          int  // query heads
	Vocab          int  // vocabulary size (the logits row)
	MicroBatch     int  // tokens per micro-batch (llama.cpp's n_ubatch)
	ContextPerSeq  int  // tokens of one session's KV cache (attention scores span it)
	FlashAttention bool // attention scores are never materialised
}

// ComputeEstimate approximates the device's compute buffer: llama.cpp
// reserves it for the worst micro-batch. Per token of the micro-batch it
// holds a few embedding-sized activations, the feed-forward's two
// intermediate rows and the logits, all float32; without flash attention
// it also holds each head's row of attention scores over the whole context
// (scores and their softmax), which is what grows with the context. The
// estimate errs high (x1.5) because an underestimate fails the load.
func ComputeEstimate(s Shape) uint64 {
	const f32 = 4
	ub := uint64(max(s.MicroBatch, 1))
	per := uint64(8*s.Embedding+3*s.FeedForward+s.Vocab) * f32
	total := ub * per
	if !s.FlashAttention {
		total += 2 * ub * uint64(s.Heads) * uint64(s.ContextPerSeq) * f32
	}
	return total * 3 / 2
}

func mib(b uint64) string { return fmt.Sprintf("%d MiB", b/MiB) }
