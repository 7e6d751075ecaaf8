package llm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	yz "github.com/hybridgroup/yzma/pkg/llama"
	"go.uber.org/zap"
)

// The current engine: a current llama.cpp, loaded at run time from prebuilt
// shared libraries through github.com/hybridgroup/yzma (purego, no cgo).
// The libraries are those of the npm package @node-llama-cpp/linux-x64,
// pinned in lockstep with yzma (a newer yzma expects symbols these
// libraries lack): `make setup` installs them into lib/llama-current.
const (
	EngineCurrent = "current"
	EngineAuto    = "auto"

	// CurrentGGMLVersion is the ggml_version() of the pinned libraries
	// (@node-llama-cpp/linux-x64 3.22.1, llama.cpp release v0.5.0), the
	// ones yzma v1.28.0 was checked against.
	CurrentGGMLVersion = "0.25.1"
)

// DefaultCurrentLibDir is where the current engine's libraries are looked
// for when Config.LibDir and $PARLEY_ENGINE_LIB are empty: beside the
// executable's bin/, lib/llama-current-cuda (the CUDA build, `make
// setup-engine-cuda`) when it holds libllama.so, else lib/llama-current (the
// CPU build, `make setup`).
func DefaultCurrentLibDir() string {
	if d := os.Getenv("PARLEY_ENGINE_LIB"); d != "" {
		return d
	}
	root := ""
	if exe, err := os.Executable(); err == nil {
		root = filepath.Dir(filepath.Dir(exe))
	}
	if cuda := filepath.Join(root, "lib", "llama-current-cuda"); fileExists(filepath.Join(cuda, "libllama.so")) {
		return cuda
	}
	return filepath.Join(root, "lib", "llama-current")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

var (
	currentOnce sync.Once
	currentErr  error
	currentDir  string
)

// loadCurrent loads the libraries in dir, once per process (llama.cpp's
// libraries cannot be unloaded): a second call with another folder fails.
func loadCurrent(dir string) error {
	currentOnce.Do(func() {
		currentDir = dir
		currentErr = loadCurrentLibs(dir)
	})
	if currentErr == nil && dir != currentDir {
		return fmt.Errorf("the current engine is loaded from %s already", currentDir)
	}
	return currentErr
}

func loadCurrentLibs(dir string) error {
	for _, name := range []string{"libllama.so", "libggml.so", "libggml-base.so"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("no %s in %s (make setup installs the current engine's libraries there)", name, dir)
		}
	}
	v, err := ggmlVersion(filepath.Join(dir, "libggml-base.so"))
	if err != nil {
		return err
	}
	if v != CurrentGGMLVersion {
		return fmt.Errorf("the libraries in %s are ggml %s; this build pins %s (yzma reads llama.h's structs as they were then)", dir, v, CurrentGGMLVersion)
	}
	if err := yz.Load(dir); err != nil {
		return fmt.Errorf("load the current engine from %s: %w", dir, err)
	}
	h, err := purego.Dlopen(filepath.Join(dir, "libllama.so"), purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("open libllama.so: %w", err)
	}
	sym, err := purego.Dlsym(h, "llama_tokenize")
	if err != nil {
		return fmt.Errorf("libllama.so has no llama_tokenize: %w", err)
	}
	purego.RegisterFunc(&llamaTokenize, sym)
	yz.LogSet(yz.LogSilent())
	yz.Init()
	// The CPU backend is one library per instruction set: ggml picks the
	// best this CPU runs.
	if err := yz.GGMLBackendLoadAllFromPath(dir); err != nil {
		return fmt.Errorf("load the current engine's backends from %s: %w", dir, err)
	}
	return nil
}

// noDevices is an empty, NULL-terminated device list for llama.cpp's model
// parameters (a package variable: its address never moves).
var noDevices [1]uintptr

// currentDevices lists the devices the current engine's backends registered:
// the CPU, and with the libraries' CUDA build each GPU its driver finds.
func currentDevices() []device {
	var ds []device
	for i := range yz.GGMLBackendDeviceCount() {
		d := yz.GGMLBackendDeviceGet(i)
		if d == 0 {
			continue
		}
		t := yz.GGMLBackendDevType(d)
		dv := device{
			name:        yz.GGMLBackendDeviceName(d),
			description: yz.GGMLBackendDeviceDescription(d),
			gpu:         t == yz.GGMLBackendDeviceTypeGPU || t == yz.GGMLBackendDeviceTypeIGPU,
			mem:         func() (uint64, uint64) { return yz.GGMLBackendDeviceMemory(d) },
		}
		dv.free, dv.total = dv.memory()
		ds = append(ds, dv)
	}
	return ds
}

// currentGPU returns the description of the first GPU the current engine's
// libraries drive (loaded from dir), if any.
func currentGPU(dir string) (string, bool) {
	if loadCurrent(dir) != nil {
		return "", false
	}
	gpu, _, ok := firstGPU(currentDevices())
	return gpu.description, ok
}

// ggmlVersion reads ggml_version() from the library at path.
func ggmlVersion(path string) (string, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	var version func() string
	sym, err := purego.Dlsym(h, "ggml_version")
	if err != nil {
		return "", fmt.Errorf("%s has no ggml_version: %w", path, err)
	}
	purego.RegisterFunc(&version, sym)
	return version(), nil
}

// current is the backend over the current llama.cpp.
type current struct {
	model  yz.Model
	vocab  yz.Vocab
	lc     yz.Context
	mem    yz.Memory
	b      yz.Batch
	tp     yz.Threadpool
	huge   *collapser // the weights' move onto huge pages; nil when none
	nVocab int
	seqIDs [][]yz.SeqId // one one-element slice per sequence id, for Batch.Add
}

var _ backend = (*current)(nil)

// openCurrent loads the libraries, the model (on a GPU when the libraries
// are the CUDA build and one is found, else on the CPU) and its context.
func openCurrent(cfg Config, meta metadata, log *zap.Logger) (*current, placement, error) {
	if err := loadCurrent(cfg.LibDir); err != nil {
		return nil, placement{}, err
	}
	// The device: a GPU when the folder holds a CUDA backend (the prebuilt
	// @node-llama-cpp/linux-x64-cuda of `make setup-engine-cuda`, or the one
	// `make cuda-current` compiles from the same source) and its driver finds
	// one, else the CPU.
	ds := currentDevices()
	dp, err := placeModel(cfg, meta, ds,
		"the current engine's libraries in "+cfg.LibDir+" have no GPU backend (make setup-engine-cuda installs its CUDA build, make cuda-current compiles one), or its driver found no device", log)
	if err != nil {
		return nil, placement{}, err
	}
	if dp.info.GPULayers > 0 {
		// A library that cannot run its kernels on this GPU aborts the
		// process at the first decode: try it in a child first.
		if err := probeCurrentGPU(cfg.LibDir, cfg.Path, dp.info.FlashAttention); err != nil {
			log.Warn("the current engine's CUDA library cannot run on this GPU (its build has no machine code for it and the driver cannot compile the PTX it has, or the GPU fails; make cuda-current compiles one for this GPU): running on the CPU",
				zap.String("gpu", dp.info.Name), zap.Error(err))
			dp = cpuPlacement(cfg, meta, ds, "the GPU failed the current engine's test decode", log)
		}
	}
	if dp.info.Type == "cpu" {
		dp.info.Name = "CPU (" + EngineCurrent + " engine)"
	}
	log.Info("the current engine's libraries", zap.String("libraries", cfg.LibDir), zap.String("device", dp.info.Name),
		zap.Int("gpu_layers", dp.info.GPULayers))
	fa := "off"
	if dp.info.FlashAttention {
		fa = "on"
	}
	if err := checkKVCacheType(cfg.KVCacheType, fa, meta); err != nil {
		return nil, placement{}, err
	}
	onCPU := dp.info.GPULayers == 0
	mp := yz.ModelDefaultParams()
	mp.NGpuLayers = int32(dp.info.GPULayers)
	if onCPU {
		// No device of the libraries' CUDA build may take part: not the
		// weights (an empty device list) nor, below, a large batch's
		// operations (op offload).
		mp.Devices = uintptr(unsafe.Pointer(&noDevices[0]))
	} else {
		// One GPU holds the model (Parley does not split a model across
		// GPUs): the first, as placeModel chose.
		mp.SplitMode, mp.MainGpu = yz.SplitModeNone, 0
	}
	var model yz.Model
	err = loadWeights(cfg, meta, &dp, log, func(inMemory bool) (err error) {
		if inMemory {
			mp.LoadMode = yz.LoadModeNone
		}
		if model, err = yz.ModelLoadFromFile(cfg.Path, mp); err == nil && model == 0 {
			err = errors.New("no model")
		}
		return err
	})
	if err != nil {
		return nil, placement{}, fmt.Errorf("load model %s: the current llama.cpp could not load it (damaged file, unsupported architecture, or too little device memory for --gpu-layers)", cfg.Path)
	}
	cp := yz.ContextDefaultParams()
	cp.NCtx = uint32(cfg.ContextLength * cfg.CacheSlots)
	cp.NBatch = uint32(cfg.BatchSize * cfg.Parallel)
	cp.NUbatch = uint32(cfg.BatchSize)
	cp.NSeqMax = uint32(cfg.CacheSlots)
	cp.NThreads, cp.NThreadsBatch = int32(cfg.Threads), int32(cfg.Threads)
	cp.FlashAttentionType = yz.FlashAttentionTypeDisabled
	if dp.info.FlashAttention {
		cp.FlashAttentionType = yz.FlashAttentionTypeEnabled
	}
	cp.Embeddings, cp.NoPerf = 0, 1
	if cfg.embedding {
		// Pooled embeddings (embed.go). A batch is one micro-batch: an
		// encoder must see every input whole.
		cp.Embeddings, cp.NBatch = 1, cp.NUbatch
	}
	if onCPU {
		cp.OpOffload = 0
	}
	cp.KVUnified = 0
	if dp.info.KVUnified {
		cp.KVUnified = 1
	}
	if t, ok := kvTypes[cfg.KVCacheType]; ok {
		cp.TypeK, cp.TypeV = t, t
	}
	var lc yz.Context
	err = createOnHugePages(&dp, log, func() (err error) {
		if lc, err = yz.InitFromModel(model, cp); err == nil && lc == 0 {
			err = errors.New("no context")
		}
		return err
	})
	if err != nil {
		dp.huge.close()
		yz.ModelFree(model)
		return nil, placement{}, fmt.Errorf("create context: %v", err)
	}
	be := &current{model: model, vocab: yz.ModelGetVocab(model), lc: lc, huge: dp.huge}
	be.nVocab = int(yz.VocabNTokens(be.vocab))
	if be.mem, err = yz.GetMemory(lc); err != nil {
		be.Close()
		return nil, placement{}, fmt.Errorf("context memory: %w", err)
	}
	if !cfg.NoThreadPool {
		tpp := yz.ThreadpoolParamsDefault(int32(cfg.Threads))
		tpp.Poll = uint32(cfg.Poll)
		if be.tp, err = yz.ThreadpoolNew(&tpp); err != nil || be.tp == 0 {
			log.Warn("no persistent thread pool: each decode step starts its own threads", zap.Error(err))
			be.tp = 0
		} else {
			yz.AttachThreadpool(lc, uintptr(be.tp), uintptr(be.tp))
		}
	}
	be.b = yz.BatchInit(int32(cfg.BatchSize*cfg.Parallel), 0, int32(cfg.Parallel))
	for i := range cfg.CacheSlots {
		be.seqIDs = append(be.seqIDs, []yz.SeqId{yz.SeqId(i)})
	}
	return be, dp, nil
}

// kvTypes maps Config.KVCacheType to ggml's types (f16 is the default).
var kvTypes = map[string]yz.GGMLType{"q8_0": 8, "q4_0": 2}

func (be *current) Name() string  { return EngineCurrent }
func (be *current) NumVocab() int { return be.nVocab }

func (be *current) TokenToPiece(tok int) string {
	buf := make([]byte, 32)
	n := yz.TokenToPiece(be.vocab, yz.Token(tok), buf, 0, true)
	if n < 0 {
		buf = make([]byte, -n)
		n = yz.TokenToPiece(be.vocab, yz.Token(tok), buf, 0, true)
	}
	if n <= 0 {
		return ""
	}
	return strings.TrimRight(string(buf[:n]), "\x00")
}

// llamaTokenize is llama.h's llama_tokenize. yzma's Tokenize passes the
// text as a C string, so a text with a NUL byte in it reaches llama.cpp as
// a null pointer (an abort in std::string); this passes its bytes and
// length, as the embedded binding does, so both engines tokenize any text
// the same way.
var llamaTokenize func(vocab uintptr, text *byte, textLen int32, tokens *int32, nMax int32, addSpecial, parseSpecial bool) int32

func (be *current) Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error) {
	if len(text) > math.MaxInt32/2 {
		return nil, errors.New("tokenize: text too long")
	}
	buf := append([]byte(text), 0) // never empty: a valid pointer even for ""
	toks := make([]int32, len(text)+2)
	n := llamaTokenize(uintptr(be.vocab), &buf[0], int32(len(text)), &toks[0], int32(len(toks)), addSpecial, parseSpecial)
	if n < 0 { // more tokens than bytes (cannot happen with a BOS and an EOS at most): retry at the size asked
		toks = make([]int32, -n)
		n = llamaTokenize(uintptr(be.vocab), &buf[0], int32(len(text)), &toks[0], int32(len(toks)), addSpecial, parseSpecial)
	}
	if n < 0 {
		return nil, errors.New("tokenize: the current engine could not tokenize the text")
	}
	out := make([]int, n)
	for i, t := range toks[:n] {
		out[i] = int(t)
	}
	return out, nil
}

func (be *current) TokenIsEog(tok int) bool { return yz.VocabIsEOG(be.vocab, yz.Token(tok)) }

func (be *current) Decode(b *batch) error {
	if err := be.b.Clear(); err != nil {
		return err
	}
	for i, tok := range b.tok {
		if err := be.b.Add(yz.Token(tok), yz.Pos(b.pos[i]), be.seqIDs[b.seq[i]], b.logits[i]); err != nil {
			return err
		}
	}
	rc, err := yz.Decode(be.lc, be.b)
	if err != nil {
		return err
	}
	if rc != 0 {
		return fmt.Errorf("llama_decode returned %d", rc)
	}
	return nil
}

func (be *current) Logits(i int) []float32 {
	l, _ := yz.GetLogitsIth(be.lc, int32(i), be.nVocab)
	return l
}

func (be *current) SeqRm(seq, p0, p1 int) bool {
	ok, err := yz.MemorySeqRm(be.mem, yz.SeqId(seq), yz.Pos(p0), yz.Pos(p1))
	return ok && err == nil
}

func (be *current) SeqCp(src, dst, p0, p1 int) {
	_ = yz.MemorySeqCp(be.mem, yz.SeqId(src), yz.SeqId(dst), yz.Pos(p0), yz.Pos(p1))
}

func (be *current) StateSeqSave(seq int) ([]byte, error) {
	n := yz.StateSeqGetSize(be.lc, yz.SeqId(seq))
	if n == 0 {
		return nil, nil
	}
	buf := make([]byte, n)
	if got := yz.StateSeqGetData(be.lc, buf, yz.SeqId(seq)); got != n {
		return nil, errors.New("llm: llama.cpp wrote a sequence state of another size than it announced")
	}
	return buf, nil
}

func (be *current) StateSeqRestore(seq int, state []byte) error {
	if len(state) == 0 {
		return errors.New("llm: empty sequence state")
	}
	if yz.StateSeqSetData(be.lc, state, yz.SeqId(seq)) == 0 {
		return errors.New("llm: llama.cpp refused the sequence state")
	}
	return nil
}

// NewSampler builds the chain the embedded engine's common_sampler builds
// (and csampler.go's grammar chain): penalties, top-k, typical, top-p,
// min-p, temperature, then a seeded draw (a temperature <= 0 leaves only
// the most likely token, so the draw is greedy).
func (be *current) NewSampler(p samplerParams) (tokenSampler, error) {
	chain := yz.SamplerChainInit(yz.SamplerChainDefaultParams())
	if chain == 0 {
		return nil, errors.New("sampler chain")
	}
	yz.SamplerChainAdd(chain, yz.SamplerInitPenalties(int32(be.nVocab), int32(p.RepeatLastN), p.PenaltyRepeat, p.PenaltyFreq, p.PenaltyPre))
	yz.SamplerChainAdd(chain, yz.SamplerInitTopK(int32(p.TopK)))
	addTail(chain, p)
	s := &currentSampler{chain: chain, lc: be.lc}
	// The chain is C memory: freed with the sampler's last reference.
	runtime.SetFinalizer(s, func(s *currentSampler) { yz.SamplerFree(s.chain) })
	return s, nil
}

// NewTail is NewSampler's chain after its penalties and top-k: this
// llama.cpp's own samplers, whose draws differ from the binding's.
func (be *current) NewTail(p samplerParams) (tail, error) {
	chain := yz.SamplerChainInit(yz.SamplerChainDefaultParams())
	if chain == 0 {
		return nil, errors.New("sampler chain")
	}
	addTail(chain, p)
	t := &currentTail{chain: chain}
	runtime.SetFinalizer(t, func(t *currentTail) { yz.SamplerFree(t.chain) })
	return t, nil
}

// addTail adds the chain's links after the penalties and top-k: typical,
// top-p, min-p, temperature and the seeded draw.
func addTail(chain yz.Sampler, p samplerParams) {
	yz.SamplerChainAdd(chain, yz.SamplerInitTypical(p.TypicalP, 0))
	yz.SamplerChainAdd(chain, yz.SamplerInitTopP(p.TopP, 0))
	yz.SamplerChainAdd(chain, yz.SamplerInitMinP(p.MinP, 0))
	yz.SamplerChainAdd(chain, yz.SamplerInitTempExt(p.Temp, 0, 1))
	yz.SamplerChainAdd(chain, yz.SamplerInitDist(p.Seed))
}

type currentTail struct{ chain yz.Sampler }

func (t *currentTail) draw(cands []tokenData) int {
	if len(cands) == 0 {
		return -1
	}
	a := yz.TokenDataArray{Data: (*yz.TokenData)(unsafe.Pointer(&cands[0])), Size: uint64(len(cands)), Selected: -1, Sorted: 1}
	yz.SamplerApply(t.chain, &a)
	runtime.KeepAlive(t)
	if a.Selected < 0 || a.Selected >= int64(a.Size) {
		return -1
	}
	return int(cands[a.Selected].ID)
}

type currentSampler struct {
	chain yz.Sampler
	lc    yz.Context
}

// Sample draws from batch row i. llama_sampler_sample accepts the token it
// returns (the penalties' window counts it), so Accept has nothing left to
// do: accepting again would count every token twice.
func (s *currentSampler) Sample(i int) int { return int(yz.SamplerSample(s.chain, s.lc, int32(i))) }
func (s *currentSampler) Accept(int)       {}

func (be *current) Close() {
	be.huge.close()
	if be.tp != 0 {
		yz.DetachThreadpool(be.lc)
		yz.ThreadpoolFree(be.tp)
	}
	_ = yz.BatchFree(be.b)
	_ = yz.Free(be.lc)
	_ = yz.ModelFree(be.model)
}
