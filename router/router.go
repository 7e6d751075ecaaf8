// Package router serves several models in one server: each configured
// model (an Entry) gets a chat responder over a stand-in for its engine,
// llm/registry loads and unloads the engines, and the Router gives each
// request the responder of the model it names, holding that model from the
// request's start until its reply has ended. It also holds EngineRef, the
// stand-in a single-model server answers through while its model loads.
package router

import (
	"context"
	"fmt"
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
	"github.com/parley-chat/parley/llm/offload"
	"github.com/parley-chat/parley/llm/registry"
	"github.com/parley-chat/parley/web"
)

// Config is the router's configuration.
type Config struct {
	Entries []Entry
	Default string // the default model's name ("": the registry's choice)
	// Engine is every model's engine configuration before its entry's own
	// ctx, parallel, threads and gpu_layers; Path is the entry's.
	Engine llm.Config
	// MaxTokens is the default reply cap: a model whose context leaves no
	// room for a prompt beside it is refused.
	MaxTokens int
	// Options are every model's responder options (an entry's template
	// adds one).
	Options []chat.Option
	// Resolve turns a model reference (a path, hf://, ollama://) into a
	// local GGUF file, fetching it when needed.
	Resolve func(ctx context.Context, ref string) (string, error)
	// ResolveProjector finds the projector of a model fetched from an
	// hf:// or ollama:// reference (ref; mmproj the entry's own, "" for
	// the one that comes with the model), or fetches the one an entry
	// names by such a reference. explicit says mmproj named it. nil: such
	// models load without a projector unless their entry names a file.
	ResolveProjector func(ctx context.Context, ref, mmproj string) (path string, explicit bool, err error)

	MaxLoaded       int                      // models loaded at once at most (0: no cap)
	MemoryBudget    int64                    // bytes the loaded models may take together (0: no budget)
	KeepAlive       time.Duration            // how long a model stays loaded after its last reply (< 0: until it must make room)
	ClientKeepAlive registry.KeepAlivePolicy // what a request's keep_alive may do
	MinResidency    time.Duration            // how long a loaded model stays at least before it makes room (< 0: auto)
	Logger          *zap.Logger
}

// CheckMaxTokens refuses a default reply cap that leaves no room in the
// context for a prompt: every text-mode prompt would fail.
func CheckMaxTokens(maxTokens, ctx int) error {
	if maxTokens >= ctx {
		return fmt.Errorf("--max-tokens %d must be below --ctx %d (the context holds the prompt and the reply): lower --max-tokens or raise --ctx", maxTokens, ctx)
	}
	return nil
}

// served is one configured model: its settings, the stand-in for its
// engine (header facts until it loads) and its chat responder, which live
// as long as the server (the engine comes and goes with the registry).
type served struct {
	entry     Entry
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

// resident is a loaded model: the registry's Model.
type resident struct {
	s   *served
	eng *llm.Engine
}

// LogFields are the registry's "model loaded" line's own fields: which
// llama.cpp engine runs the model (--engine auto picks at each load).
func (r *resident) LogFields() []zap.Field {
	return []zap.Field{zap.String("engine", r.eng.EngineName())}
}

// Close detaches the engine from its responder and shuts it down. The
// registry calls it only when no reply uses the model.
func (r *resident) Close(ctx context.Context) error {
	r.s.ref.Set(nil)
	return r.eng.Shutdown(ctx)
}

// Router gives each request its model: it holds the model (a registry
// lease) from the request's start until its reply has ended. It is the
// server's parley.Responder; View is its web.Models.
type Router struct {
	cfg    Config
	reg    *registry.Registry
	served map[string]*served
	def    string
}

var (
	_ parley.Responder = (*Router)(nil)
	_ web.Models       = (*view)(nil)
)

// New configures every model (reading each local GGUF's header: a missing
// or damaged file is logged and refused when that model is asked for, the
// others serve) and the registry over them. Nothing loads until asked for;
// Start loads the models marked to load at startup.
func New(cfg Config) (*Router, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m := &Router{cfg: cfg, served: make(map[string]*served, len(cfg.Entries))}
	specs := make([]registry.Spec, 0, len(cfg.Entries))
	for _, e := range cfg.Entries {
		s, spec, err := m.newServed(e)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", e.Name, err)
		}
		m.served[e.Name] = s
		specs = append(specs, spec)
	}
	reg, err := registry.New(specs, func(ctx context.Context, name string, progress func(float64)) (registry.Model, error) {
		return m.load(ctx, m.served[name], progress)
	}, registry.Config{
		MaxLoaded:       cfg.MaxLoaded,
		MemoryBudget:    cfg.MemoryBudget,
		KeepAlive:       cfg.KeepAlive,
		ClientKeepAlive: cfg.ClientKeepAlive,
		MinResidency:    cfg.MinResidency,
		Default:         cfg.Default,
		Logger:          cfg.Logger.Named("models"),
	})
	if err != nil {
		return nil, err
	}
	m.reg, m.def = reg, reg.Default()
	return m, nil
}

// newServed configures one model.
func (m *Router) newServed(e Entry) (*served, registry.Spec, error) {
	lcfg := m.cfg.Engine
	lcfg.Path = e.Path
	lcfg.Projector = e.Mmproj
	if e.Ctx > 0 {
		lcfg.ContextLength = e.Ctx
	}
	if e.Parallel > 0 {
		lcfg.Parallel = e.Parallel
	}
	if e.Threads > 0 {
		lcfg.Threads = e.Threads
	}
	if e.GPULayers != nil {
		lcfg.GPULayers = *e.GPULayers
	}
	if lcfg.Logger != nil {
		lcfg.Logger = lcfg.Logger.With(zap.String("model", e.Name))
	}
	opts := slices.Clone(m.cfg.Options)
	if e.Template != "" {
		opt, err := TemplateOption(e.Template)
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
			m.cfg.Logger.Warn("model cannot be read; it is refused when asked for", zap.String("model", e.Name), zap.Error(err))
			s.badFile = parley.Errorf(parley.EUnavailable, "model %q cannot be loaded: %v", e.Name, err)
		} else {
			s.ref.header, s.estimate = info, est
			s.ref.header.Vision = e.Mmproj != "" // said before it loads; a projector that fails fails the load
			spec.Estimate, spec.EstimateDetail = est.Total(), est.String()
		}
	}
	if s.ref.header.Pooling == "" { // an embedding model writes no replies: the reply cap is not its
		if err := CheckMaxTokens(m.cfg.MaxTokens, lcfg.ContextLength); err != nil {
			return nil, registry.Spec{}, err
		}
	}
	s.responder = chat.NewResponder(s.ref, opts...)
	gpuLayers := "auto"
	if lcfg.GPULayers != offload.Auto {
		gpuLayers = strconv.Itoa(lcfg.GPULayers)
	}
	s.settings = map[string]any{
		"path": e.Path, "ctx": lcfg.ContextLength, "parallel": lcfg.Parallel, "threads": lcfg.Threads,
		"gpu_layers": gpuLayers, "pin": e.Pin, "load_at_startup": e.Load,
	}
	if e.Template != "" {
		s.settings["template"] = e.Template
	}
	if e.Mmproj != "" {
		s.settings["mmproj"] = filepath.Base(e.Mmproj) // its name only: a path is the operator's
	}
	return s, spec, nil
}

// load resolves the model's source and opens its engine (the registry's
// Loader).
func (m *Router) load(ctx context.Context, s *served, progress func(float64)) (registry.Model, error) {
	path := s.entry.Path
	if m.cfg.Resolve != nil {
		var err error
		if path, err = m.cfg.Resolve(ctx, s.entry.Path); err != nil {
			return nil, err
		}
	}
	lcfg := s.lcfg
	lcfg.Path = path
	found := false // a projector that came with the model, not one the entry named
	if e := s.entry; m.cfg.ResolveProjector != nil && (strings.Contains(e.Path, "://") || strings.Contains(e.Mmproj, "://")) {
		proj, explicit, err := m.cfg.ResolveProjector(ctx, e.Path, e.Mmproj)
		switch {
		case err != nil && explicit:
			return nil, fmt.Errorf("mmproj: %w", err)
		case err != nil:
			m.cfg.Logger.Warn("no projector loaded: name one with mmproj", zap.String("model", e.Name), zap.Error(err))
		}
		lcfg.Projector, found = proj, !explicit && proj != ""
	}
	if budget := m.cfg.MemoryBudget; budget > 0 && strings.Contains(s.entry.Path, "://") {
		// A downloaded model's size is known only now: one over the whole
		// budget is refused before it loads, as a local one is earlier.
		if _, est, err := llm.Inspect(lcfg); err == nil && est.Total() > budget {
			return nil, parley.Errorf(parley.ETooLarge, "model %q needs about %s (%s), more than the whole memory budget of %s (--max-models-memory)",
				s.entry.Name, registry.MiB(est.Total()), est, registry.MiB(budget))
		}
	}
	lcfg.Progress = func(f float32) { progress(float64(f)) }
	m.cfg.Logger.Info("loading model", zap.String("model", s.entry.Name), zap.String("path", path), zap.String("projector", lcfg.Projector))
	eng, err := llm.Open(lcfg)
	if err != nil && found {
		// A projector that came with the model is a convenience: one that does not load leaves a text model.
		m.cfg.Logger.Warn("the projector that came with the model did not load; serving without images",
			zap.String("model", s.entry.Name), zap.String("projector", lcfg.Projector), zap.Error(err))
		lcfg.Projector = ""
		eng, err = llm.Open(lcfg)
	}
	if err != nil {
		return nil, err
	}
	if err := CheckMaxTokens(m.cfg.MaxTokens, eng.Info().ContextLength); err != nil && eng.Info().Pooling == "" {
		// An embedding model writes no replies: the reply cap is not its.
		_ = eng.Shutdown(ctx)
		return nil, err
	}
	s.ref.Set(eng)
	return &resident{s: s, eng: eng}, nil
}

// Engine is /info's engine: the one that runs the default model, or, while
// it is not loaded, a sentence that says so (which engine runs a model is
// decided when it loads).
func (m *Router) Engine() string {
	if e := EngineLabel(m.served[m.def].ref.Name()); e != "" {
		return e
	}
	return "none: the default model is not loaded (each loaded model's engine is in models)"
}

// Default is the default model's name.
func (m *Router) Default() string { return m.def }

// Names are the models' names, in their configured order.
func (m *Router) Names() []string { return m.reg.Names() }

// Info is the default model's facts (its GGUF header's until it loads).
func (m *Router) Info() parley.ModelInfo { return m.served[m.def].ref.Info() }

// View is the registry as web.Models: list, load and unload.
func (m *Router) View() web.Models { return &view{r: m} }

// Start loads the models marked to load at startup, one after another, and
// returns when they have loaded or failed (a failure is logged: the model
// is retried when asked for) or ctx has ended.
func (m *Router) Start(ctx context.Context) {
	for _, n := range m.reg.Names() {
		if m.served[n].entry.Load {
			if err := m.reg.Load(ctx, n); err != nil && ctx.Err() == nil {
				m.cfg.Logger.Warn("loading at startup", zap.String("model", n), zap.Error(err))
			}
		}
	}
}

// Close unloads every model, waiting for their replies until ctx ends.
func (m *Router) Close(ctx context.Context) error { return m.reg.Close(ctx) }

// acquire resolves model ("" the default) and holds it; keepAlive is the
// request's (nil: none), progress is shown a load it waits for (nil: none).
func (m *Router) acquire(ctx context.Context, model string, keepAlive *time.Duration, progress parley.LoadProgress) (*served, *registry.Lease, error) {
	name, err := m.reg.Resolve(model)
	if err != nil {
		return nil, nil, err
	}
	s := m.served[name]
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	l, err := m.reg.Acquire(ctx, name, keepAlive, progress)
	if err != nil {
		return nil, nil, err
	}
	return s, l, nil
}

// hold releases l when rep has ended.
func hold(rep parley.Reply, l *registry.Lease) {
	go func() {
		<-rep.Done()
		l.Release()
	}()
}

// Reply is the reply of req.Model's responder, the model held until the
// reply has ended.
func (m *Router) Reply(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	s, l, err := m.acquire(ctx, req.Model, req.KeepAlive, req.LoadProgress)
	if err != nil {
		return nil, err
	}
	rep, err := s.responder.Reply(ctx, req)
	if err != nil {
		l.Release()
		return nil, err
	}
	hold(rep, l)
	return rep, nil
}

// Complete is Reply for a raw prompt.
func (m *Router) Complete(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	s, l, err := m.acquire(ctx, req.Model, req.KeepAlive, req.LoadProgress)
	if err != nil {
		return nil, err
	}
	rep, err := s.responder.Complete(ctx, req)
	if err != nil {
		l.Release()
		return nil, err
	}
	hold(rep, l)
	return rep, nil
}

// Template is the default model's template.
func (m *Router) Template() chat.Template { return m.served[m.def].responder.Template() }

// TemplateFor is model's template (the default's for a name that does not
// resolve; the request is refused elsewhere).
func (m *Router) TemplateFor(model string) chat.Template {
	if name, err := m.reg.Resolve(model); err == nil {
		return m.served[name].responder.Template()
	}
	return m.Template()
}

// CountTokensFor counts req's prompt tokens with req.Model's responder.
func (m *Router) CountTokensFor(ctx context.Context, req parley.ReplyRequest) (int, error) {
	s, l, err := m.acquire(ctx, req.Model, req.KeepAlive, req.LoadProgress)
	if err != nil {
		return 0, err
	}
	defer l.Release()
	return s.responder.CountTokens(req.Key, req.Messages, req.Params)
}

// Tokenize tokenizes with the default model (web's Tokenizer; requests
// use TokenizerFor).
func (m *Router) Tokenize(text string) ([]int, error) {
	t, release, err := m.TokenizerFor(context.Background(), "", true)
	if err != nil {
		return nil, err
	}
	defer release()
	return t.Tokenize(text)
}

// TokenizerFor is model's engine, held until release; without load, nil
// when the model is not loaded.
func (m *Router) TokenizerFor(ctx context.Context, model string, load bool) (web.Tokenizer, func(), error) {
	if !load {
		l, ok := m.reg.TryAcquire(model)
		if !ok {
			return nil, func() {}, nil
		}
		return l.Model().(*resident).eng, l.Release, nil
	}
	_, l, err := m.acquire(ctx, model, nil, nil)
	if err != nil {
		return nil, func() {}, err
	}
	return l.Model().(*resident).eng, l.Release, nil
}

// Stats sums the loaded engines' counters for /metrics. An engine's
// counters leave the sum when it unloads (a counter reset, to Prometheus).
func (m *Router) Stats() web.EngineStats {
	var sum web.EngineStats
	for _, s := range m.served {
		st := s.ref.Stats()
		sum.Slots += st.Slots
		sum.SlotsBusy += st.SlotsBusy
		sum.Queued += st.Queued
		sum.PromptEvaluated += st.PromptEvaluated
		sum.PromptReused += st.PromptReused
		sum.PromptCopied += st.PromptCopied
		sum.Preemptions += st.Preemptions
		sum.TokensGenerated += st.TokensGenerated
		sum.Steps += st.Steps
		sum.StepTime += st.StepTime
		sum.SlowConsumerDrops += st.SlowConsumerDrops
		sum.GrammarDeadEnds += st.GrammarDeadEnds
		sum.OverStepBudget += st.OverStepBudget
		sum.Images.Encoded += st.Images.Encoded
		sum.Images.EncodeTime += st.Images.EncodeTime
		sum.Images.Reused += st.Images.Reused
		sum.DeviceMemoryUsed = max(sum.DeviceMemoryUsed, st.DeviceMemoryUsed)
		sum.DeviceMemoryTotal = max(sum.DeviceMemoryTotal, st.DeviceMemoryTotal)
	}
	return sum
}

// view is the registry as web.Models.
type view struct{ r *Router }

func (v *view) Resolve(name string) (string, error) { return v.r.reg.Resolve(name) }

func (v *view) Load(ctx context.Context, name string) error {
	_, l, err := v.r.acquire(ctx, name, nil, nil)
	if err != nil {
		return err
	}
	l.Release()
	return nil
}

func (v *view) Unload(name string) error { return v.r.reg.Unload(name) }

func (v *view) Models() []web.ModelStatus {
	sts := v.r.reg.Status()
	out := make([]web.ModelStatus, 0, len(sts))
	for _, st := range sts {
		s := v.r.served[st.Name]
		m := web.ModelStatus{
			Name: st.Name, State: string(st.State), Default: st.Default, Pinned: st.Pinned,
			SizeBytes: st.Estimate, InFlight: st.InFlight, Waiting: st.Waiting,
			LastError: st.LastError, Settings: s.settings, Info: s.ref.Info(),
			KeepAlive: "forever", Engine: EngineLabel(s.ref.Name()),
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
