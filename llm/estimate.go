package llm

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/offload"
)

// MemoryEstimate is what a model will take in memory once loaded, read
// from its GGUF header before llama.cpp sees the file: its weights (the
// file, which llama.cpp maps), its KV cache for every cache slot and its
// compute buffers (offload.ComputeEstimate, which errs high). The KV
// swap's RAM tier comes on top.
type MemoryEstimate struct {
	WeightBytes  int64 // the GGUF file
	KVBytes      int64 // ContextLength (rounded up as llama.cpp does) x CacheSlots tokens of K and V, every layer; 0 for an encoder
	ComputeBytes int64 // one micro-batch's activations
}

// Total is the estimate in bytes.
func (m MemoryEstimate) Total() int64 { return m.WeightBytes + m.KVBytes + m.ComputeBytes }

// String says what the estimate is made of, in MiB.
func (m MemoryEstimate) String() string {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	return fmt.Sprintf("file %.1f MiB + KV cache %.1f MiB + compute %.1f MiB", mib(m.WeightBytes), mib(m.KVBytes), mib(m.ComputeBytes))
}

// Inspect reads cfg.Path's header (a missing, foreign or damaged file is
// an error naming it, as Open's) and returns the model's facts as Open
// with cfg would report them (the device's excepted), and the memory it
// would take.
func Inspect(cfg Config) (parley.ModelInfo, MemoryEstimate, error) {
	meta, err := readMetadata(cfg.Path)
	if err != nil {
		return parley.ModelInfo{}, MemoryEstimate{}, err
	}
	if err := cfg.applyDefaults(meta, zap.NewNop()); err != nil {
		return parley.ModelInfo{}, MemoryEstimate{}, err
	}
	info := meta.info
	info.Path, info.ContextLength, info.Parallel = cfg.Path, cfg.ContextLength, cfg.Parallel
	shape := meta.shape
	shape.MicroBatch, shape.ContextPerSeq, shape.FlashAttention = cfg.BatchSize, cfg.ContextLength, cfg.FlashAttention == "on"
	// The engine's context holds ContextLength tokens for each of
	// CacheSlots sequences (an embedding model's default is
	// DefaultEmbedSequences, and its ContextLength at most BatchSize,
	// applyDefaults). An architecture without a KV
	// cache (an encoder) keeps none of them, and its attention spans one
	// micro-batch, the most an input may hold.
	var kv int64
	if archHasKV(meta.info.Architecture) {
		kv = int64(kvBytesPerToken(meta, cfg.KVCacheType) * float64(ctxPadded(cfg.ContextLength)*cfg.CacheSlots))
	} else {
		shape.ContextPerSeq = cfg.BatchSize
	}
	return info, MemoryEstimate{
		WeightBytes:  meta.info.SizeBytes,
		KVBytes:      kv,
		ComputeBytes: int64(offload.ComputeEstimate(shape)),
	}, nil
}

// llamaCtxPad is what llama.cpp rounds a context up to a multiple of: each
// sequence's (n_ctx_seq) with a stream per sequence, the whole context's
// with one shared stream (llama_context's constructor, in both engines'
// llama.cpp).
const llamaCtxPad = 256

// ctxPadded is the KV cache llama.cpp opens for a sequence of n tokens of
// context, in tokens. For a shared stream (KVUnified) it errs high, by
// less than llamaCtxPad tokens a sequence.
func ctxPadded(n int) int {
	return (n + llamaCtxPad - 1) / llamaCtxPad * llamaCtxPad
}

// kvBytesPerToken is the KV cache one token takes in one sequence, over
// every layer, for the cache type typ (GGUFs that leave out the head sizes
// or the key/value heads get them from the shape).
func kvBytesPerToken(meta metadata, typ string) float64 {
	return kvBytesPerLayerToken(meta, typ) * float64(meta.info.Layers)
}

// kvBytesPerLayerToken is kvBytesPerToken for one layer.
func kvBytesPerLayerToken(meta metadata, typ string) float64 {
	headK, headV := meta.headK, meta.headV
	if headK == 0 && meta.shape.Heads > 0 {
		headK = meta.shape.Embedding / meta.shape.Heads
	}
	if headV == 0 {
		headV = headK
	}
	headsKV := meta.headsKV
	if headsKV == 0 {
		headsKV = meta.shape.Heads
	}
	return float64(headsKV*(headK+headV)) * kvBytesPerValue(typ)
}

// kvBytesPerValue is the size of one KV cache value of each cache type
// (q8_0 and q4_0 blocks hold 32 values in 34 and 18 bytes).
func kvBytesPerValue(typ string) float64 {
	switch typ {
	case "q8_0":
		return 34.0 / 32
	case "q4_0":
		return 18.0 / 32
	}
	return 2 // f16
}
