package llm

import (
	"errors"
	"fmt"

	"github.com/ollama/ollama/llama"
	"github.com/ollama/ollama/ml"
	ggmlsrc "github.com/ollama/ollama/ml/backend/ggml/ggml/src"
	"go.uber.org/zap"
)

// EngineEmbedded is the engine built into the binary: the cgo binding
// github.com/ollama/ollama/llama (llama.cpp of 2025-12-16), built from
// source, always available.
const EngineEmbedded = "embedded"

// embedded is the backend over the binding. Its types stay in this file
// (and in the cgo helpers it calls: threadpool.go, logits.go,
// ctxparams.go, state.go).
type embedded struct {
	model  *llama.Model
	lc     *llama.Context
	b      *llama.Batch
	pool   *threadPool // the decode threads; nil when none is attached
	huge   *collapser  // the weights' move onto huge pages; nil when none
	logits logitsReader
	nVocab int
	// threads is the context's thread count, which freeContext checks.
	threads int
	// onGPU: layers went to a GPU, and Close leaves the context to the
	// process (see Close).
	onGPU bool
}

var _ backend = (*embedded)(nil)

// openEmbedded places the model on a device, checks the KV cache type
// against that placement, loads the weights, creates the llama.cpp context
// with its thread pool and the decode batch. cfg has its defaults.
func openEmbedded(cfg Config, meta metadata, log *zap.Logger) (*embedded, placement, error) {
	model, lc, dp, err := loadModel(cfg, meta, log)
	if err != nil {
		return nil, placement{}, err
	}
	be := &embedded{model: model, lc: lc, nVocab: model.NumVocab(), threads: cfg.Threads, onGPU: dp.info.GPULayers > 0, huge: dp.huge}
	if !cfg.NoThreadPool {
		if be.pool, err = attachThreadPool(lc, cfg.Threads, cfg.Poll); err != nil {
			log.Warn("no persistent thread pool: each decode step starts its own threads", zap.Error(err))
		}
	}
	be.logits = newLogitsReader(lc, cfg.Threads, be.nVocab)
	if be.b, err = llama.NewBatch(cfg.BatchSize, cfg.Parallel, 0); err != nil {
		be.huge.close()
		be.pool.free()
		freeContext(lc, cfg.Threads)
		llama.FreeModel(model)
		return nil, placement{}, fmt.Errorf("allocate batch: %w", err)
	}
	return be, dp, nil
}

// embeddedGPU returns the description of the GPU the embedded build would
// offload to, loading its backend libraries (lib/ollama) as loadModel does.
func embeddedGPU() (string, bool) {
	llama.BackendInit()
	gpu, _, ok := firstGPU(devices())
	return gpu.description, ok
}

// loadModel places the model on a device, checks the KV cache type against
// that placement, loads the weights and creates the llama.cpp context.
// cfg has its defaults (applyDefaults).
func loadModel(cfg Config, meta metadata, log *zap.Logger) (*llama.Model, *llama.Context, placement, error) {
	// Loads the backend libraries beside the executable (lib/ollama): the
	// devices are known from here on.
	llama.BackendInit()
	dp, err := placeModel(cfg, meta, devices(),
		fmt.Sprintf("no GPU backend library in %v, or its driver found no device", ggmlsrc.LibPaths()), log)
	if err != nil {
		return nil, nil, placement{}, err
	}
	faName := "off"
	if dp.info.FlashAttention {
		faName = "on"
	}
	if err := checkKVCacheType(cfg.KVCacheType, faName, meta); err != nil {
		return nil, nil, placement{}, err
	}

	if cfg.Progress == nil {
		cfg.Progress = func(float32) {} // without a callback llama.cpp prints dots to stderr
	}
	mp := llama.ModelParams{UseMmap: true, Progress: cfg.Progress, NumGpuLayers: dp.info.GPULayers}
	if dp.info.GPULayers > 0 {
		mp.Devices = []uint64{dp.index}
	}
	var model *llama.Model
	err = loadWeights(cfg, meta, &dp, log, func(inMemory bool) (err error) {
		mp.UseMmap = !inMemory
		model, err = llama.LoadModelFromFile(cfg.Path, mp)
		return err
	})
	if err != nil {
		return nil, nil, placement{}, fmt.Errorf("load model %s: the embedded llama.cpp (2025-12) could not load it: a damaged file, too little device memory for --gpu-layers, "+
			"or an architecture (%q) added to llama.cpp since, which the current engine loads (--engine current; README, Engines)", cfg.Path, meta.info.Architecture)
	}
	fa := ml.FlashAttentionDisabled
	if dp.info.FlashAttention {
		fa = ml.FlashAttentionEnabled
	}
	params := llama.NewContextParams(cfg.ContextLength*cfg.CacheSlots, cfg.BatchSize, cfg.CacheSlots, cfg.Threads, fa, cfg.KVCacheType)
	unified := dp.info.KVUnified
	if !tuneContextParams(&params, contextShape{cfg.ContextLength * cfg.CacheSlots, cfg.BatchSize, cfg.CacheSlots, cfg.Threads}, unified) {
		dp.info.KVUnified = false
		if unified {
			log.Warn("the binding's context parameters are not the ones this build knows: the KV cache stays one stream per slot")
		}
	}
	if cfg.embedding {
		// Pooled embeddings (embed.go). Where the mirror does not match,
		// tuneContextParams left the binding's default, which is on.
		embeddingsOn(&params)
	}
	var lc *llama.Context
	err = createOnHugePages(&dp, log, func() (err error) {
		lc, err = llama.NewContextWithModel(model, params)
		return err
	})
	if err != nil {
		dp.huge.close()
		llama.FreeModel(model)
		return nil, nil, placement{}, fmt.Errorf("create context: %w", err)
	}
	if n := model.NumVocab(); n != meta.vocab.size() && meta.vocab.size() > 0 {
		log.Warn("vocabulary size differs between metadata and llama.cpp", zap.Int("metadata", meta.vocab.size()), zap.Int("llama", n))
	}
	return model, lc, dp, nil
}

func (be *embedded) Name() string                { return EngineEmbedded }
func (be *embedded) NumVocab() int               { return be.nVocab }
func (be *embedded) TokenToPiece(tok int) string { return be.model.TokenToPiece(tok) }
func (be *embedded) TokenIsEog(tok int) bool     { return be.model.TokenIsEog(tok) }
func (be *embedded) Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error) {
	return be.model.Tokenize(text, addSpecial, parseSpecial)
}

// Decode copies b into the binding's batch and decodes it.
func (be *embedded) Decode(b *batch) error {
	be.b.Clear()
	for i, tok := range b.tok {
		be.b.Add(int(tok), nil, int(b.pos[i]), b.logits[i], int(b.seq[i]))
	}
	return be.lc.Decode(be.b)
}

func (be *embedded) Logits(i int) []float32     { return be.logits.view(i) }
func (be *embedded) SeqRm(seq, p0, p1 int) bool { return be.lc.KvCacheSeqRm(seq, p0, p1) }
func (be *embedded) SeqCp(src, dst, p0, p1 int) { be.lc.KvCacheSeqCp(src, dst, p0, p1) }

func (be *embedded) NewSampler(p samplerParams) (tokenSampler, error) {
	sc, err := llama.NewSamplingContext(be.model, llama.SamplingParams{
		TopK:           p.TopK,
		TopP:           p.TopP,
		MinP:           p.MinP,
		TypicalP:       p.TypicalP,
		Temp:           p.Temp,
		RepeatLastN:    p.RepeatLastN,
		PenaltyRepeat:  p.PenaltyRepeat,
		PenaltyFreq:    p.PenaltyFreq,
		PenaltyPresent: p.PenaltyPre,
		Seed:           p.Seed,
	})
	if err != nil {
		return nil, err
	}
	return embeddedSampler{sc: sc, lc: be.lc}, nil
}

func (be *embedded) NewTail(p samplerParams) (tail, error) { return newTailChain(p), nil }

// embeddedSampler is the binding's common_sampler (freed by its finalizer).
type embeddedSampler struct {
	sc *llama.SamplingContext
	lc *llama.Context
}

func (s embeddedSampler) Sample(i int) int { return s.sc.Sample(s.lc, i) }
func (s embeddedSampler) Accept(tok int)   { s.sc.Accept(tok, true) }

// Close frees the thread pool, the context (through the mirrored pointer:
// the binding has no call for it; a context that is not the mirrored one is
// left to the process) and the model.
//
// A context with layers on a GPU is left to the process too: llama_free of
// the binding's context crashed the process (SIGSEGV inside llama_free) on an
// H200 with the CUDA backend of make cuda, and Ollama, the binding's author,
// never frees one (its runner process exits instead). The cost is the
// context's device memory (KV cache, compute buffers) until the process
// ends, once per unload of a GPU model (several models).
func (be *embedded) Close() {
	be.huge.close()
	be.b.Free()
	be.pool.free()
	if !be.onGPU {
		freeContext(be.lc, be.threads)
	}
	llama.FreeModel(be.model)
}

// errNoState is StateSeqSave's and StateSeqRestore's error when the
// binding's context is not the mirrored one (see contextPointer).
var errNoState = errors.New("llm: per-sequence state needs the binding's context, which this build does not recognise")
