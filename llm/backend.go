package llm

import (
	"path/filepath"
	"strings"

	"go.uber.org/zap"
)

// backend is one llama.cpp engine under the decode loop: a loaded model and
// its context. Everything the loop, the slots and the samplers need from
// llama.cpp goes through it, so the engine's own types (the binding's, or
// another library's) stay inside its adapter (embedded.go: the cgo binding
// github.com/ollama/ollama/llama, built from source). Only the loop's
// goroutine calls the context's methods (Decode, Logits, Seq*, State*,
// samplers' Sample); the vocabulary's are safe from any goroutine.
type backend interface {
	// Name is the engine's name, as --engine spells it.
	Name() string

	// NumVocab is the vocabulary size; TokenToPiece a token's raw text.
	NumVocab() int
	TokenToPiece(tok int) string
	// Tokenize turns text into tokens; addSpecial adds BOS when the model
	// wants it, parseSpecial turns special-token text into its tokens.
	Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error)
	TokenIsEog(tok int) bool

	// Decode evaluates b. Logits(i) is then the logits of b's row i (one
	// asked for with logits), read in place: valid until the next Decode.
	Decode(b *batch) error
	Logits(i int) []float32

	// SeqRm removes seq's cache cells at positions [p0, p1) (p1 < 0: to the
	// end) and reports whether it could; SeqCp copies src's cells to dst.
	SeqRm(seq, p0, p1 int) bool
	SeqCp(src, dst, p0, p1 int)
	// StateSeqSave returns seq's KV cache state (llama.cpp's per-sequence
	// state); StateSeqRestore loads such a state into seq.
	StateSeqSave(seq int) ([]byte, error)
	StateSeqRestore(seq int, state []byte) error

	// NewSampler makes an unconstrained sampler chain over the context.
	NewSampler(p samplerParams) (tokenSampler, error)
	// NewTail makes the part of that chain after its penalties and top-k,
	// for prefilterSampler, which does those two itself.
	NewTail(p samplerParams) (tail, error)

	// Close frees the context and the model. The loop must have ended.
	Close()
}

// samplerParams are the unconstrained sampler chain's settings.
type samplerParams struct {
	TopK                                   int
	TopP, MinP, TypicalP, Temp             float32
	RepeatLastN                            int
	PenaltyRepeat, PenaltyFreq, PenaltyPre float32
	Seed                                   uint32
}

// tail draws a token from the top-k candidates (largest first; rewritten
// in place), -1 when it draws none.
type tail interface {
	draw(cands []tokenData) int
}

// tokenSampler samples one sequence inline, on the loop, from a batch row.
type tokenSampler interface {
	Sample(i int) int
	Accept(tok int)
}

// batch is one decode step's tokens, built by the loop and handed to
// Decode, which copies it into its engine's own batch.
type batch struct {
	size   int // capacity in tokens
	tok    []int32
	pos    []int32
	seq    []int32
	logits []bool
}

func newBatch(size int) *batch {
	return &batch{size: size, tok: make([]int32, 0, size), pos: make([]int32, 0, size),
		seq: make([]int32, 0, size), logits: make([]bool, 0, size)}
}

// add appends one token of sequence seq at position pos; logits asks for
// its row's logits.
func (b *batch) add(tok, pos, seq int, logits bool) {
	b.tok = append(b.tok, int32(tok))
	b.pos = append(b.pos, int32(pos))
	b.seq = append(b.seq, int32(seq))
	b.logits = append(b.logits, logits)
}

func (b *batch) clear() {
	b.tok, b.pos, b.seq, b.logits = b.tok[:0], b.pos[:0], b.seq[:0], b.logits[:0]
}

func (b *batch) numTokens() int { return len(b.tok) }

// openBackend opens cfg.Engine's backend; "auto" takes the current engine
// when its libraries load and falls back to the embedded one with one log
// line when they do not, or when layers are to go to a GPU that the
// embedded build drives (lib/ollama from make cuda). Layers for a GPU that
// only the current engine's CUDA build drives go to the current engine.
func openBackend(cfg Config, meta metadata, log *zap.Logger) (backend, placement, error) {
	switch cfg.Engine {
	case EngineCurrent:
		return openCurrent(cfg, meta, log)
	case EngineAuto:
		if cfg.Projector != "" && loadCurrent(cfg.LibDir) == nil {
			log.Info("engine auto: using the current engine, which runs the projector", zap.String("projector", cfg.Projector))
			return openCurrent(cfg, meta, log)
		}
		if cfg.GPULayers != 0 {
			if gpu, ok := embeddedGPU(); ok {
				log.Info("engine auto: using the embedded engine, which offloads to the GPU (its CUDA backend, lib/ollama, is there)",
					zap.String("gpu", gpu))
				break
			}
		}
		if err := loadCurrent(cfg.LibDir); err != nil {
			log.Info("engine auto: the current engine's libraries did not load, using the embedded engine", zap.Error(err))
			break
		}
		if cfg.GPULayers != 0 {
			if gpu, ok := currentGPU(cfg.LibDir); ok {
				log.Info("engine auto: using the current engine, whose CUDA libraries offload to the GPU", zap.String("gpu", gpu))
				return openCurrent(cfg, meta, log)
			}
		}
		if autoPrefersEmbedded(meta, cfg.LibDir) {
			be, p, err := openEmbedded(cfg, meta, log)
			if err == nil {
				log.Info("engine auto: using the embedded engine for F16 weights (the current engine's prebuilt CPU library evaluates prompts of F16 models about 2x slower and decodes them no faster; make setup builds one that does not: BENCHMARKS.md)",
					zap.String("quantization", meta.info.Quantization))
				return be, p, nil
			}
			log.Info("engine auto: the embedded engine could not load the model, using the current engine", zap.Error(err))
		}
		return openCurrent(cfg, meta, log)
	}
	return openEmbedded(cfg, meta, log)
}

// autoPrefersEmbedded reports whether auto runs a model the embedded engine
// can load on it rather than on the current engine: models of F16 weights
// when the current engine's folder holds the prebuilt CPU variants, whose
// F16 matrix kernel evaluates prompts about 2.3 times slower (38 to 512
// tokens, 2 threads, the synthetic 135M model) while they decode at the same
// rate. The CPU backend that make setup compiles from the same source
// (scripts/build-current-backend.sh, libggml-cpu.so in the folder) evaluates
// them as fast as the embedded engine. On Q8_0 and Q4_0 the current engine is
// as fast or faster with either (docs/notes/2026-11-27-cpu-backend-from-source.md).
func autoPrefersEmbedded(meta metadata, libDir string) bool {
	return strings.EqualFold(meta.info.Quantization, "F16") && !fileExists(filepath.Join(libDir, "libggml-cpu.so"))
}
