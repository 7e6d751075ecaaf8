package main

// Several models in one server (--models DIR, --models-file FILE): the
// configuration of each model, the registry (llm/registry) that loads and
// unloads them, and the router that gives each request its model's chat
// responder. With neither flag the server runs its one --model as before
// (engineRef in main.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/llm/registry"
	"github.com/parley-chat/parley/llm/source"
	"github.com/parley-chat/parley/web"
)

// modelsFlags are the flags of several models.
type modelsFlags struct {
	dir, file       string
	maxLoaded       int
	memory          modelsBudget
	keepAlive       time.Duration
	clientKeepAlive keepAlivePolicyFlag
	minResidency    residencyFlag
}

func (m *modelsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.dir, "models", "", "serve every *.gguf in this folder, each named after its file (without .gguf); a request's model field picks one, loaded on first use")
	fs.StringVar(&m.file, "models-file", "", "a JSON file of models and their settings (see the README's \"Several models\"); with --models, its entries add to and override the folder's")
	fs.IntVar(&m.maxLoaded, "max-loaded-models", 0, "models loaded at once at most, with several models (0 = no cap): the least recently used idle one unloads first")
	m.memory, m.minResidency = -1, -1
	fs.Var(&m.memory, "max-models-memory", "memory the loaded models may take together, estimated from each GGUF's size and its KV cache (auto = three quarters of the machine's memory; 0 = no budget); a model over the whole budget is refused before it loads; e.g. 8GiB")
	fs.DurationVar(&m.keepAlive, "keep-alive", registry.DefaultKeepAlive, "with several models, how long a model stays loaded after its last reply (a negative value: until it must make room); see --client-keep-alive for a request's keep_alive")
	fs.Var(&m.clientKeepAlive, "client-keep-alive", "what a request's keep_alive may do: extend (lengthen the model's stay after that reply, never shorten it or unload the model for others), obey (Ollama's: it becomes the model's, 0 unloads it), ignore")
	fs.Var(&m.minResidency, "min-residency", "how long a loaded model stays at least before it is unloaded for another model's room (requests for the other wait meanwhile): a duration, 0 = none, auto = 3x its own load time, at most a minute")
}

// modelsBudget is --max-models-memory: a size, or auto (< 0), three
// quarters of the machine's memory.
type modelsBudget int64

func (b *modelsBudget) String() string {
	if *b < 0 {
		return "auto"
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *modelsBudget) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		*b = -1
		return nil
	}
	var n byteSize
	if err := n.Set(s); err != nil {
		return err
	}
	*b = modelsBudget(n)
	return nil
}

// bytes is the budget in bytes (0: none): auto is three quarters of
// /proc/meminfo's MemTotal, or no budget where that cannot be read.
func (b modelsBudget) bytes() int64 {
	if b >= 0 {
		return int64(b)
	}
	return memTotal() / 4 * 3
}

// memTotal is the machine's memory in bytes (0 when unknown).
func memTotal() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// keepAlivePolicyFlag is --client-keep-alive.
type keepAlivePolicyFlag registry.KeepAlivePolicy

func (p *keepAlivePolicyFlag) String() string { return registry.KeepAlivePolicy(*p).String() }

func (p *keepAlivePolicyFlag) Set(s string) error {
	v, err := registry.ParseKeepAlivePolicy(s)
	*p = keepAlivePolicyFlag(v)
	return err
}

// residencyFlag is --min-residency: a duration, or auto (< 0).
type residencyFlag time.Duration

func (r *residencyFlag) String() string {
	if *r < 0 {
		return "auto"
	}
	return time.Duration(*r).String()
}

func (r *residencyFlag) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		*r = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 10s, 0 or auto, got %q", s)
	}
	*r = residencyFlag(d)
	return nil
}

func (c config) severalModels() bool { return c.models.dir != "" || c.models.file != "" }

// modelEntry is one model of the models file.
type modelEntry struct {
	Name      string          `json:"name"`
	Path      string          `json:"path"` // a GGUF path, hf://OWNER/REPO/FILE.gguf or ollama://NAME[:TAG]
	Ctx       int             `json:"ctx,omitempty"`
	Parallel  int             `json:"parallel,omitempty"`
	Threads   int             `json:"threads,omitempty"`
	GPULayers *int            `json:"gpu_layers,omitempty"` // -1 = auto
	Template  string          `json:"template,omitempty"`   // as --template
	Pin       bool            `json:"pin,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"` // "10m", seconds, or -1 (forever)
	Load      bool            `json:"load,omitempty"`       // load at startup
	Default   bool            `json:"default,omitempty"`
}

// modelsFile is the models file.
type modelsFile struct {
	Models []modelEntry `json:"models"`
}

// maxModelsFileBytes bounds the models file.
const maxModelsFileBytes = 1 << 20

// modelEntries gathers the models from --models, --models-file and --model
// (the default, when given), and names the default model.
func modelEntries(cfg config) ([]modelEntry, string, error) {
	var out []modelEntry
	add := func(e modelEntry) {
		if i := slices.IndexFunc(out, func(o modelEntry) bool { return o.Name == e.Name }); i >= 0 {
			out[i] = e
			return
		}
		out = append(out, e)
	}
	if cfg.models.dir != "" {
		paths, err := filepath.Glob(filepath.Join(cfg.models.dir, "*.gguf"))
		if err != nil {
			return nil, "", fmt.Errorf("--models: %w", err)
		}
		if _, err := os.Stat(cfg.models.dir); err != nil {
			return nil, "", fmt.Errorf("--models: %w", err)
		}
		slices.Sort(paths)
		for _, p := range paths {
			add(modelEntry{Name: nameOf(p), Path: p})
		}
	}
	def := ""
	if cfg.models.file != "" {
		entries, err := readModelsFile(cfg.models.file)
		if err != nil {
			return nil, "", fmt.Errorf("--models-file %s: %w", cfg.models.file, err)
		}
		for _, e := range entries {
			if e.Default {
				if def != "" {
					return nil, "", fmt.Errorf("--models-file: both %q and %q are the default", def, e.Name)
				}
				def = e.Name
			}
			add(e)
		}
	}
	if cfg.model != "" {
		e := modelEntry{Name: nameOf(cfg.model), Path: cfg.model}
		add(e)
		def = e.Name
	}
	if len(out) == 0 {
		return nil, "", errors.New("no models: --models found no *.gguf and no other model is configured")
	}
	if def == "" {
		def = firstSound(out)
	}
	return out, def, nil
}

// firstSound names the default model when none is named: the first entry
// that is not a local file failing its GGUF check (a remote hf:// or
// ollama:// entry counts as sound until it is fetched), so that one damaged
// file in --models does not become every default request's error. "" when
// none is: the registry then takes the first.
func firstSound(entries []modelEntry) string {
	for _, e := range entries {
		if strings.Contains(e.Path, "://") || source.CheckGGUF(e.Path) == nil {
			return e.Name
		}
	}
	return ""
}

// readModelsFile reads and checks the models file: unknown fields, a
// model without a path and a name given twice are errors that name them.
func readModelsFile(path string) ([]modelEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxModelsFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxModelsFileBytes {
		return nil, fmt.Errorf("over %d bytes", maxModelsFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var mf modelsFile
	if err := dec.Decode(&mf); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i := range mf.Models {
		e := &mf.Models[i]
		if e.Path == "" {
			return nil, fmt.Errorf("models[%d]: path is required", i)
		}
		if e.Name == "" {
			e.Name = nameOf(e.Path)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("models[%d]: the name %q is given twice", i, e.Name)
		}
		seen[e.Name] = true
		if _, err := e.keepAlive(); err != nil {
			return nil, fmt.Errorf("models[%d] (%s): keep_alive: %w", i, e.Name, err)
		}
		if e.Ctx < 0 || e.Parallel < 0 || e.Threads < 0 || (e.GPULayers != nil && *e.GPULayers < -1) {
			return nil, fmt.Errorf("models[%d] (%s): ctx, parallel, threads and gpu_layers must not be negative (gpu_layers -1 = auto)", i, e.Name)
		}
	}
	return mf.Models, nil
}

// keepAlive is the entry's keep_alive (nil: the flag's): a duration string
// ("10m"), a number of seconds, or a negative number (forever).
func (e modelEntry) keepAlive() (*time.Duration, error) {
	raw := bytes.TrimSpace(e.KeepAlive)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("want a duration such as \"10m\" or a number of seconds, got %q", s)
		}
		return &d, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return nil, fmt.Errorf("want a duration such as \"10m\" or a number of seconds, got %s", raw)
	}
	d := time.Duration(f * float64(time.Second))
	if f < 0 {
		d = -1
	}
	return &d, nil
}

// nameOf names a model after its file: the base name without .gguf (for
// ollama://NAME:TAG, NAME-TAG).
func nameOf(ref string) string {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "ollama://"), "hf://")
	if i := strings.LastIndex(ref, "@"); i > 0 && !strings.Contains(ref[i:], "/") {
		ref = ref[:i] // an hf:// revision
	}
	base := filepath.Base(ref)
	base = strings.TrimSuffix(base, filepath.Ext(base))
	return strings.ReplaceAll(base, ":", "-")
}

// served is one configured model: its settings, the stand-in for its
// engine (header facts until it loads) and its chat responder, which live
// as long as the server (the engine comes and goes with the registry).
type served struct {
	entry     modelEntry
	lcfg      llm.Config // Path unresolved (hf://, ollama://)
	ref       *modelRef
	responder *chat.Responder
	estimate  llm.MemoryEstimate
	settings  map[string]any

	mu      sync.Mutex
	badFile error // why the local GGUF could not be read when last looked at; nil when it could
}

// check reads the model's GGUF header again when the model is not loaded
// (it may have been replaced or mended since): a missing or damaged file
// is refused here, for this model alone, before the registry makes room
// for it by unloading others.
func (s *served) check() error {
	if strings.Contains(s.entry.Path, "://") || s.ref.p.Load() != nil {
		return nil
	}
	_, _, err := llm.Inspect(s.lcfg)
	if err != nil {
		err = parley.Errorf(parley.EUnavailable, "model %q cannot be loaded: %v", s.entry.Name, err)
	}
	s.mu.Lock()
	s.badFile = err
	s.mu.Unlock()
	return err
}

func (s *served) fileError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.badFile == nil {
		return ""
	}
	return parley.ErrorMessage(s.badFile)
}

// modelRef is an engineRef whose Info is the GGUF header's until the model
// loads, so its template and facts are known without loading it.
type modelRef struct {
	engineRef
	header parley.ModelInfo
}

func (r *modelRef) Info() parley.ModelInfo {
	if e := r.p.Load(); e != nil {
		return e.Info()
	}
	return r.header
}

// resident is a loaded model: the registry's Model.
type resident struct {
	s   *served
	eng *llm.Engine
}

// Close detaches the engine from its responder and shuts it down. The
// registry calls it only when no reply uses the model.
func (r *resident) Close(ctx context.Context) error {
	r.s.ref.set(nil)
	return r.eng.Shutdown(ctx)
}

// router gives each request its model: it holds the model (a registry
// lease) from the request's start until its reply has ended.
type router struct {
	reg    *registry.Registry
	served map[string]*served
	def    string
}

var (
	_ web.Responder = (*router)(nil)
	_ web.Models    = (*modelsView)(nil)
)

// acquire resolves ctx's model and holds it.
func (m *router) acquire(ctx context.Context) (*served, *registry.Lease, error) {
	name, err := m.reg.Resolve(parley.ModelFrom(ctx))
	if err != nil {
		return nil, nil, err
	}
	s := m.served[name]
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	l, err := m.reg.Acquire(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return s, l, nil
}

// hold releases l when rep has ended.
func hold(rep *chat.Reply, l *registry.Lease) {
	go func() {
		<-rep.Done()
		l.Release()
	}()
}

func (m *router) Reply(ctx context.Context, key string, msgs []parley.Message, p parley.Params) (*chat.Reply, error) {
	s, l, err := m.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := s.responder.Reply(ctx, key, msgs, p)
	if err != nil {
		l.Release()
		return nil, err
	}
	hold(rep, l)
	return rep, nil
}

func (m *router) Complete(ctx context.Context, key, prompt string, p parley.Params) (*chat.Reply, error) {
	s, l, err := m.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := s.responder.Complete(ctx, key, prompt, p)
	if err != nil {
		l.Release()
		return nil, err
	}
	hold(rep, l)
	return rep, nil
}

// Template is the default model's template.
func (m *router) Template() chat.Template { return m.served[m.def].responder.Template() }

// TemplateFor is ctx's model's template (the default's for a name that
// does not resolve; the request is refused elsewhere).
func (m *router) TemplateFor(ctx context.Context) chat.Template {
	if name, err := m.reg.Resolve(parley.ModelFrom(ctx)); err == nil {
		return m.served[name].responder.Template()
	}
	return m.Template()
}

func (m *router) CountTokensFor(ctx context.Context, key string, msgs []parley.Message, p parley.Params) (int, error) {
	s, l, err := m.acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer l.Release()
	return s.responder.CountTokens(key, msgs, p)
}

// Tokenize tokenizes with the default model (web's Tokenizer; requests
// use TokenizerFor).
func (m *router) Tokenize(text string) ([]int, error) {
	t, release, err := m.TokenizerFor(context.Background(), true)
	if err != nil {
		return nil, err
	}
	defer release()
	return t.Tokenize(text)
}

// TokenizerFor is ctx's model's engine, held until release; without load,
// nil when the model is not loaded.
func (m *router) TokenizerFor(ctx context.Context, load bool) (web.Tokenizer, func(), error) {
	if !load {
		l, ok := m.reg.TryAcquire(parley.ModelFrom(ctx))
		if !ok {
			return nil, func() {}, nil
		}
		return l.Model().(*resident).eng, l.Release, nil
	}
	_, l, err := m.acquire(ctx)
	if err != nil {
		return nil, func() {}, err
	}
	return l.Model().(*resident).eng, l.Release, nil
}

// stats sums the loaded engines' counters for /metrics. An engine's
// counters leave the sum when it unloads (a counter reset, to Prometheus).
func (m *router) stats() web.EngineStats {
	var sum web.EngineStats
	for _, s := range m.served {
		st := s.ref.stats()
		sum.Slots += st.Slots
		sum.SlotsBusy += st.SlotsBusy
		sum.Queued += st.Queued
		sum.PromptEvaluated += st.PromptEvaluated
		sum.PromptReused += st.PromptReused
		sum.PromptCopied += st.PromptCopied
		sum.TokensGenerated += st.TokensGenerated
		sum.Steps += st.Steps
		sum.StepTime += st.StepTime
		sum.SlowConsumerDrops += st.SlowConsumerDrops
		sum.GrammarDeadEnds += st.GrammarDeadEnds
		sum.OverStepBudget += st.OverStepBudget
		sum.DeviceMemoryUsed = max(sum.DeviceMemoryUsed, st.DeviceMemoryUsed)
		sum.DeviceMemoryTotal = max(sum.DeviceMemoryTotal, st.DeviceMemoryTotal)
	}
	return sum
}

// modelsView is the registry as web.Models.
type modelsView struct{ r *router }

func (v *modelsView) Resolve(name string) (string, error) { return v.r.reg.Resolve(name) }
func (v *modelsView) Load(ctx context.Context, name string) error {
	_, l, err := v.r.acquire(parley.WithModel(ctx, name))
	if err != nil {
		return err
	}
	l.Release()
	return nil
}
func (v *modelsView) Unload(name string) error { return v.r.reg.Unload(name) }

func (v *modelsView) Models() []web.ModelStatus {
	sts := v.r.reg.Status()
	out := make([]web.ModelStatus, 0, len(sts))
	for _, st := range sts {
		s := v.r.served[st.Name]
		m := web.ModelStatus{
			Name: st.Name, State: string(st.State), Default: st.Default, Pinned: st.Pinned,
			SizeBytes: st.Estimate, InFlight: st.InFlight, Waiting: st.Waiting,
			LastError: st.LastError, Settings: s.settings, Info: s.ref.Info(),
			KeepAlive: "forever",
		}
		if m.LastError == "" {
			m.LastError = s.fileError()
		}
		if st.KeepAlive >= 0 {
			m.KeepAlive = st.KeepAlive.String()
		}
		if st.State == registry.Loading {
			m.Progress = st.Progress
		}
		if !st.ExpiresAt.IsZero() {
			t := st.ExpiresAt.UTC()
			m.ExpiresAt = &t
		}
		out = append(out, m)
	}
	if i := slices.IndexFunc(out, func(m web.ModelStatus) bool { return m.Default }); i > 0 {
		d := out[i]
		out = slices.Delete(out, i, i+1)
		out = slices.Insert(out, 0, d)
	}
	return out
}

// newRouter configures every model (reading each local GGUF's header: a
// missing or damaged file is logged and refused when that model is asked
// for, the others serve) and the registry over them.
func newRouter(cfg config, log *zap.Logger, stderr io.Writer, ropts []chat.Option) (*router, error) {
	entries, def, err := modelEntries(cfg)
	if err != nil {
		return nil, err
	}
	m := &router{served: make(map[string]*served, len(entries))}
	specs := make([]registry.Spec, 0, len(entries))
	for _, e := range entries {
		s, spec, err := newServed(cfg, e, log, ropts)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", e.Name, err)
		}
		m.served[e.Name] = s
		specs = append(specs, spec)
	}
	reg, err := registry.New(specs, func(ctx context.Context, name string, progress func(float64)) (registry.Model, error) {
		return m.served[name].load(ctx, cfg, log, stderr, progress)
	}, registry.Config{
		MaxLoaded:       cfg.models.maxLoaded,
		MemoryBudget:    cfg.models.memory.bytes(),
		KeepAlive:       cfg.models.keepAlive,
		ClientKeepAlive: registry.KeepAlivePolicy(cfg.models.clientKeepAlive),
		MinResidency:    time.Duration(cfg.models.minResidency),
		Default:         def,
		Logger:          log.Named("models"),
	})
	if err != nil {
		return nil, err
	}
	m.reg, m.def = reg, reg.Default()
	return m, nil
}

// newServed configures one model.
func newServed(cfg config, e modelEntry, log *zap.Logger, ropts []chat.Option) (*served, registry.Spec, error) {
	mc := cfg
	if e.Ctx > 0 {
		mc.ctx = e.Ctx
	}
	if e.Parallel > 0 {
		mc.parallel = e.Parallel
	}
	if e.Threads > 0 {
		mc.threads = e.Threads
	}
	if e.GPULayers != nil {
		mc.gpuLayers = gpuLayersFlag(*e.GPULayers)
	}
	if err := checkMaxTokens(mc.maxTokens, mc.ctx); err != nil {
		return nil, registry.Spec{}, err
	}
	lcfg := engineConfig(mc, e.Path, log.Named("llm").With(zap.String("model", e.Name)))
	opts := slices.Clone(ropts)
	if e.Template != "" {
		opt, err := templateOption(e.Template)
		if err != nil {
			return nil, registry.Spec{}, fmt.Errorf("template: %w", err)
		}
		opts = append(opts, opt)
	}
	ka, _ := e.keepAlive() // checked when the file was read
	s := &served{entry: e, lcfg: lcfg, ref: &modelRef{}}
	spec := registry.Spec{Name: e.Name, Pin: e.Pin, KeepAlive: ka}
	if !strings.Contains(e.Path, "://") {
		info, est, err := llm.Inspect(lcfg)
		if err != nil {
			// This model alone cannot load: said when it is asked for.
			log.Warn("model cannot be read; it is refused when asked for", zap.String("model", e.Name), zap.Error(err))
			s.badFile = parley.Errorf(parley.EUnavailable, "model %q cannot be loaded: %v", e.Name, err)
		} else {
			s.ref.header, s.estimate = info, est
			spec.Estimate, spec.EstimateDetail = est.Total(), est.String()
		}
	}
	s.responder = chat.NewResponder(s.ref, opts...)
	s.settings = map[string]any{
		"path": e.Path, "ctx": mc.ctx, "parallel": mc.parallel, "threads": mc.threads,
		"gpu_layers": mc.gpuLayers.String(), "pin": e.Pin, "load_at_startup": e.Load,
	}
	if e.Template != "" {
		s.settings["template"] = e.Template
	}
	return s, spec, nil
}

// load resolves the model's source and opens its engine (the registry's
// Loader).
func (s *served) load(ctx context.Context, cfg config, log *zap.Logger, stderr io.Writer, progress func(float64)) (registry.Model, error) {
	mc := cfg
	mc.model = s.entry.Path
	path, err := resolveModel(ctx, mc, stderr)
	if err != nil {
		return nil, err
	}
	lcfg := s.lcfg
	lcfg.Path = path
	if budget := cfg.models.memory.bytes(); budget > 0 && strings.Contains(s.entry.Path, "://") {
		// A downloaded model's size is known only now: one over the whole
		// budget is refused before it loads, as a local one is earlier.
		if _, est, err := llm.Inspect(lcfg); err == nil && est.Total() > budget {
			return nil, parley.Errorf(parley.ETooLarge, "model %q needs about %s (%s), more than the whole memory budget of %s (--max-models-memory)",
				s.entry.Name, registry.MiB(est.Total()), est, registry.MiB(budget))
		}
	}
	lcfg.Progress = func(f float32) { progress(float64(f)) }
	log.Info("loading model", zap.String("model", s.entry.Name), zap.String("path", path))
	eng, err := llm.Open(lcfg)
	if err != nil {
		return nil, err
	}
	if err := checkMaxTokens(cfg.maxTokens, eng.Info().ContextLength); err != nil {
		_ = eng.Shutdown(ctx)
		return nil, err
	}
	s.ref.set(eng)
	return &resident{s: s, eng: eng}, nil
}

// serveSeveral is run's serving for several models: the router, the
// sessions and the server over it; the models load on demand (and those
// marked load at startup, in the background), so the server is ready at
// once.
func serveSeveral(ctx context.Context, cfg config, log *zap.Logger, stderr io.Writer, ropts []chat.Option, build func(r *router) (*web.Server, error)) error {
	m, err := newRouter(cfg, log, stderr, ropts)
	if err != nil {
		return err
	}
	srv, err := build(m)
	if err != nil {
		_ = m.reg.Close(context.Background())
		return err
	}
	names := m.reg.Names()
	log.Info("serving several models", zap.Strings("models", names), zap.String("default", m.def),
		zap.Int("max_loaded_models", cfg.models.maxLoaded), zap.Int64("max_models_memory", cfg.models.memory.bytes()),
		zap.Stringer("client_keep_alive", &cfg.models.clientKeepAlive), zap.Stringer("min_residency", &cfg.models.minResidency))
	srv.SetReady(true)
	startup := make(chan struct{})
	go func() {
		defer close(startup)
		for _, n := range names {
			if m.served[n].entry.Load {
				if err := m.reg.Load(ctx, n); err != nil && ctx.Err() == nil {
					log.Warn("loading at startup", zap.String("model", n), zap.Error(err))
				}
			}
		}
	}()
	log.Info("serving", zap.String("url", srv.URL()))
	<-ctx.Done()
	log.Info("shutting down", zap.Duration("drain_timeout", cfg.drainTimeout))
	<-startup
	closeCtx, cancel := context.WithTimeout(context.Background(), cfg.drainTimeout+5*time.Second)
	defer cancel()
	if cerr := srv.Close(closeCtx); cerr != nil {
		log.Warn("shutdown", zap.Error(cerr))
	}
	if cerr := m.reg.Close(closeCtx); cerr != nil {
		log.Warn("models shutdown", zap.Error(cerr))
	}
	log.Info("stopped")
	return nil
}
