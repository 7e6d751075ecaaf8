package llm

import (
	"fmt"
	"runtime"
	"time"

	"go.uber.org/zap"
)

// Defaults for Config's zero values.
const (
	DefaultContextLength = 2048 // tokens per slot
	DefaultParallel      = 4    // slots
	DefaultBatchSize     = 512  // tokens per llama.cpp micro-batch
	DefaultQueueSize     = 64   // requests that may wait for a slot
	MaxCacheSlots        = 256  // KV-cache slots (sequences): llama.cpp's LLAMA_MAX_SEQ

	// DefaultStepBudget is how long one sequence's share of a decode step
	// (its grammar check and sampling) may take before it is ended.
	DefaultStepBudget = 2 * time.Second

	// DefaultMaxOverrunsPerClient and DefaultMaxOverruns cap the abandoned
	// grammar samplers still running in llama.cpp (see Config).
	DefaultMaxOverrunsPerClient = 2
	DefaultMaxOverruns          = 8
)

// Config configures Open. Zero values take the defaults above.
type Config struct {
	Path          string // GGUF file
	ContextLength int    // tokens per slot (each session's window); capped at the model's training context, and an embedding model's at BatchSize
	Parallel      int    // sequences that generate at once, each with its own KV-cache slot
	Threads       int    // CPU threads for decoding; default runtime.NumCPU()
	BatchSize     int    // tokens per llama.cpp micro-batch
	QueueSize     int    // requests that may wait for a free slot before Generate returns EBusy; < 0 means none
	// MaxQueuedPerClient is how many of those one client (GenerateRequest.Client)
	// may have waiting; past it its requests are refused with busy while
	// other clients still get in. 0 means QueueSize/2 + Parallel.
	MaxQueuedPerClient int
	// MaxSlotsPerClient is how many slots one client may hold while
	// another client waits for one (alone, a client may use them all).
	// 0 means Parallel - Parallel/4; < 0 means no cap. Waiting clients are
	// served round robin either way.
	MaxSlotsPerClient int
	// CacheSlots is how many KV-cache slots are kept: conversations whose
	// cache survives between their turns. At least Parallel (the default);
	// only Parallel of them generate at once. More slots than Parallel let
	// more clients than that resend a growing conversation and have only
	// its new tokens evaluated, at the cost of their KV memory
	// (ContextLength tokens each).
	CacheSlots int
	// FlashAttention: "off" (default), "on", or "auto": on when layers are
	// offloaded to a GPU, off on the CPU. Off on the CPU because there
	// ggml's flash-attention kernel walks the keys one at a time, so every
	// token costs more as the conversation grows (measured in
	// BENCHMARKS.md, "Flash attention on CPU": at 500 tokens of context stories260K decodes at a
	// quarter of its short-context rate with it on, at a steady rate with
	// it off), while the plain path is a matrix product. On a GPU it is the
	// other way round: without it the attention scores of every session are
	// materialised, and at 64 sessions the compute buffer outgrows the step
	// (docs/notes/2026-11-25-gpu.md).
	FlashAttention string
	// GPULayers is how many layers go to the first GPU (llama.cpp's
	// n_gpu_layers: the model's blocks from the last backwards, then its
	// output head). 0 (the default) keeps everything on the CPU;
	// offload.Auto (-1) offloads as many as fit in the device's free memory
	// with their KV cache and the compute buffers (see package offload);
	// more than the model has means all. Without a GPU it is 0 whatever it
	// says, and Open logs so.
	GPULayers int
	// KVUnified: "off" (default): each slot is its own KV stream; "on":
	// all slots share one buffer, so a decode step is one pass over the
	// weights however the busy slots are spread, but every token's
	// attention then spans the whole shared buffer. Measured on an H100 at
	// 64 sessions (docs/notes/2026-11-25-gpu.md) the shared buffer lost:
	// 3,094 tok/s against 5,196 with streams. See tuneContextParams.
	KVUnified string
	// KVCacheType is the KV cache's element type: "f16" (default), "q8_0"
	// (about half the memory) or "q4_0" (about a quarter). llama.cpp
	// quantizes the V cache only with flash attention, and its quantized
	// blocks hold 32 values, so the quantized types need FlashAttention
	// "on" and a model whose key and value head sizes are equal multiples
	// of 32; Open refuses anything else with an error (llama.cpp would
	// fail or assert).
	KVCacheType string
	// KVCache swaps sessions' KV state to RAM and disk when their slot goes
	// to another session, and restores it when they come back (kvswap.go).
	KVCache KVCacheConfig
	// StepBudget bounds the time one sequence spends sampling a token
	// (grammar matching included): a sequence over it is ended with an
	// error. Grammar-constrained sequences sample off the decode loop, so
	// theirs never stalls the others. Zero means DefaultStepBudget.
	StepBudget time.Duration
	// MaxOverrunsPerClient and MaxOverruns cap the grammar samplers that
	// overran the step budget and are still inside llama.cpp (a C call
	// cannot be interrupted: each holds a CPU thread until it returns), per
	// client (GenerateRequest.Client) and in all. While a cap is reached, new
	// grammar-constrained requests are refused. Zero means the defaults
	// (DefaultMaxOverrunsPerClient, DefaultMaxOverruns).
	MaxOverrunsPerClient int
	MaxOverruns          int
	// Poll is how hard the decode threads poll for the next step between
	// steps, 0 to 100 (ggml's polling level): they spin for a while before
	// they sleep, so a step that follows soon starts without waking them.
	// 0 means DefaultPoll; negative means no polling (the workers sleep at
	// once). See docs/notes/2026-11-25-thread-pool-and-engines.md for its idle CPU cost.
	Poll int
	// HugePages is where a model placed wholly on the CPU keeps its
	// weights: "auto" (the default, "" too) reads them into memory on
	// transparent huge pages when the kernel offers them and the file is at
	// most half the available memory (hugepages.go); "off" maps the file,
	// as llama.cpp does by default.
	HugePages string
	// NoThreadPool leaves the context without a persistent thread pool:
	// ggml then starts and joins its worker threads for every step (the
	// per-step threads; for measurement).
	NoThreadPool bool
	// Engine is the llama.cpp that runs the model: "embedded" (the
	// default: the binding built into the binary), "current" (a current
	// llama.cpp from the shared libraries in LibDir, on the CPU), or "auto"
	// (current when its libraries load, else embedded, said in one log
	// line). See backend.go and README, "Engines".
	Engine string
	// LibDir is the current engine's library folder; empty means
	// DefaultCurrentLibDir ($PARLEY_ENGINE_LIB, else lib/llama-current
	// beside the executable's folder).
	LibDir string
	// Draft is speculative decoding from the conversation (draft.go):
	// "auto" drafts where the step times the loop measures say a draft
	// token pays for itself, "ngram" whenever the history offers a
	// continuation, "off" (the default, "" too) never. The sampling
	// distribution is the model's either way, and the tokens are the same
	// given the same logits; llama.cpp's logits for a step of several
	// positions of a sequence round otherwise than for one, so a seeded
	// sampled reply can take another token where its draw falls that close
	// to a boundary (draft.go).
	Draft string
	// DraftMax is the longest draft per sequence and step; 0 means
	// DefaultDraftMax.
	DraftMax int
	// DraftModel is a small model of the same vocabulary whose greedy
	// continuation is the draft (draftmodel.go), instead of the
	// conversation's own text; it runs on the same engine. With it, Draft
	// "" or "off" means "auto".
	DraftModel string
	// Projector is a vision projector GGUF ("mmproj") for the model: with
	// it the engine takes images (parley.GenerateRequest.Images). Only the
	// current engine runs one, through libmtmd beside its libraries.
	Projector string
	// Progress, when set, is called with the load progress in [0, 1].
	Progress func(float32)
	// embedding is set by applyDefaults when the GGUF names a pooling
	// type: the context computes pooled embeddings (embed.go).
	embedding bool
	Logger    *zap.Logger
	// wrapBackend, set by the package's tests, wraps the opened backend
	// (a backend whose logits are a function of each row's token and
	// position alone, for instance).
	wrapBackend func(backend) backend
}

// applyDefaults gives cfg's zero fields their defaults, caps the context
// length at the model's training context (meta) and refuses unknown
// FlashAttention and KVUnified values. Open and Inspect both call it, so
// the estimate counts the slots the engine opens: an embedding model (meta
// names a pooling type) gets DefaultEmbedSequences cache slots when
// CacheSlots is not set, and a context length of at most BatchSize.
func (cfg *Config) applyDefaults(meta metadata, log *zap.Logger) error {
	cfg.embedding = meta.embed.pooling != poolingNone
	if cfg.embedding && cfg.CacheSlots == 0 {
		cfg.CacheSlots = DefaultEmbedSequences
	}
	if cfg.ContextLength <= 0 {
		cfg.ContextLength = DefaultContextLength
	}
	if meta.info.TrainContext > 0 && cfg.ContextLength > meta.info.TrainContext {
		log.Warn("context length capped at the model's training context",
			zap.Int("requested", cfg.ContextLength), zap.Int("train_context", meta.info.TrainContext))
		cfg.ContextLength = meta.info.TrainContext
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.CacheSlots < cfg.Parallel {
		cfg.CacheSlots = cfg.Parallel
	}
	if cfg.CacheSlots > MaxCacheSlots {
		return fmt.Errorf("cache slots: at most %d (llama.cpp's sequence limit), got %d", MaxCacheSlots, cfg.CacheSlots)
	}
	if cfg.Threads <= 0 {
		cfg.Threads = runtime.NumCPU()
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.embedding && cfg.ContextLength > cfg.BatchSize {
		// An embedding input is at most one micro-batch (EmbedInfo.MaxTokens)
		// and every batch starts its inputs at position 0, so no sequence
		// ever holds more than BatchSize tokens: a longer context per
		// sequence would be KV cache (DefaultEmbedSequences times over)
		// that nothing fills.
		cfg.ContextLength = cfg.BatchSize
	}
	if cfg.StepBudget <= 0 {
		cfg.StepBudget = DefaultStepBudget
	}
	if cfg.MaxOverrunsPerClient <= 0 {
		cfg.MaxOverrunsPerClient = DefaultMaxOverrunsPerClient
	}
	if cfg.MaxOverruns <= 0 {
		cfg.MaxOverruns = DefaultMaxOverruns
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	} else if cfg.QueueSize < 0 {
		cfg.QueueSize = 0
	}
	if cfg.MaxQueuedPerClient <= 0 {
		cfg.MaxQueuedPerClient = cfg.QueueSize/2 + cfg.Parallel
	}
	if cfg.MaxSlotsPerClient == 0 {
		cfg.MaxSlotsPerClient = cfg.Parallel - cfg.Parallel/4
	}

	switch {
	case cfg.Poll == 0:
		cfg.Poll = DefaultPoll
	case cfg.Poll < 0:
		cfg.Poll = 0
	case cfg.Poll > 100:
		return fmt.Errorf("poll: want 0 to 100, got %d", cfg.Poll)
	}
	switch cfg.FlashAttention {
	case "", "off", "on", "auto":
	default:
		return fmt.Errorf("flash attention: want auto, on or off, got %q", cfg.FlashAttention)
	}
	switch cfg.Engine {
	case "":
		cfg.Engine = EngineEmbedded
	case EngineEmbedded, EngineCurrent, EngineAuto:
	default:
		return fmt.Errorf("engine: want auto, embedded or current, got %q", cfg.Engine)
	}
	if cfg.LibDir == "" {
		cfg.LibDir = DefaultCurrentLibDir()
	}
	switch cfg.HugePages {
	case "":
		cfg.HugePages = HugePagesAuto
	case HugePagesAuto, HugePagesOff:
	default:
		return fmt.Errorf("huge pages: want auto or off, got %q", cfg.HugePages)
	}
	if cfg.Draft == "" || cfg.Draft == DraftOff && cfg.DraftModel != "" {
		cfg.Draft = DraftOff
		if cfg.DraftModel != "" {
			cfg.Draft = DraftAuto
		}
	}
	if cfg.DraftMax == 0 {
		cfg.DraftMax = DefaultDraftMax
	}
	if err := checkDraft(cfg.Draft, cfg.DraftMax); err != nil {
		return err
	}
	switch cfg.KVUnified {
	case "", "off", "on":
	default:
		return fmt.Errorf("kv unified: want on or off, got %q", cfg.KVUnified)
	}
	return nil
}

// kvQuantBlock is how many values one q8_0 or q4_0 block holds.
const kvQuantBlock = 32

// checkKVCacheType refuses KV cache types llama.cpp cannot use with this
// model and flash-attention setting, before it sees them: the binding maps
// an unknown name to f16 without a word, llama.cpp refuses a quantized V
// cache without flash attention, and a head size that is not a whole
// number of quantized blocks trips an assertion in ggml (an abort).
func checkKVCacheType(typ, flashAttn string, meta metadata) error {
	switch typ {
	case "", "f16":
		return nil
	case "q8_0", "q4_0":
	default:
		return fmt.Errorf("kv cache type: want f16, q8_0 or q4_0, got %q", typ)
	}
	if flashAttn != "on" {
		return fmt.Errorf("kv cache type %s needs flash attention on (llama.cpp quantizes the V cache only with it)", typ)
	}
	k, v := meta.headK, meta.headV
	if k == 0 || k != v || k%kvQuantBlock != 0 {
		return fmt.Errorf("kv cache type %s: the model's key and value heads hold %d and %d values; a quantized cache needs equal multiples of %d (use f16)", typ, k, v, kvQuantBlock)
	}
	return nil
}
