package web

// Several models in one server. With WithModels the request's model field
// (or a WebSocket's ?model=) picks the model: pickModel resolves it (an
// unknown name is a 404 naming the models served) and puts the name in the
// request's context (parley.WithModel), where the Responder, which routes
// by it, and the session layer, which records it in a new session, find it.
// Without WithModels the server serves one model and ignores the field, as
// it always has.
//
//	GET  /v1/models                       every model, its state, size and settings
//	POST /admin/models/{name}/load        load a model now (the API key; 403 without --api-key)
//	POST /admin/models/{name}/unload      unload it (or when its replies end)

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// Models is the registry of the models a server serves when it serves
// several (cmd/parley adapts llm/registry to it).
type Models interface {
	// Resolve returns the served name that name stands for ("" is the
	// default model), or an ENotFound error that names the models served.
	Resolve(name string) (string, error)
	// Models reports every model, the default first.
	Models() []ModelStatus
	// Load loads a model now and waits until it is loaded.
	Load(ctx context.Context, name string) error
	// Unload unloads a model now, or when its replies in flight end
	// (then an EBusy error saying so).
	Unload(name string) error
}

// ModelStatus is one model as /v1/models, /health and Ollama's /api/tags
// and /api/ps show it.
type ModelStatus struct {
	Name      string           `json:"id"`
	State     string           `json:"state"` // unloaded, loading, loaded, unloading
	Default   bool             `json:"default,omitempty"`
	Pinned    bool             `json:"pinned,omitempty"`
	SizeBytes int64            `json:"size_bytes"` // the memory it takes loaded: file + KV cache (an estimate)
	KeepAlive string           `json:"keep_alive"` // how long it stays once idle ("forever" for pinned or negative)
	ExpiresAt *time.Time       `json:"expires_at,omitempty"`
	InFlight  int              `json:"replies_in_flight"`
	Waiting   int              `json:"waiting,omitempty"`
	Progress  float64          `json:"progress,omitempty"` // of a load in progress, 0 to 1
	LastError string           `json:"last_error,omitempty"`
	Settings  map[string]any   `json:"settings,omitempty"` // ctx, parallel, threads, gpu_layers, template, path
	Info      parley.ModelInfo `json:"-"`                  // the GGUF's facts (from its header; device facts once loaded)
}

// WithModels makes the server serve several models (see Models); r must
// route by parley.ModelFrom.
func WithModels(m Models) Option { return func(s *Server) { s.models = m } }

// pickModel resolves name, a request's model field, and makes the request's
// context carry the model (and keepAlive, when the request set one). With
// one model it does nothing: the field is not checked, as before.
func (s *Server) pickModel(c echo.Context, name string) error {
	n, err := s.resolveModel(name)
	if err != nil || n == "" {
		return err
	}
	r := c.Request()
	c.SetRequest(r.WithContext(parley.WithModel(r.Context(), n)))
	return nil
}

// resolveModel is the served name of a request's model field ("" with one
// model), Ollama-style names included; an unknown name is the registry's
// 404 that names the models served.
func (s *Server) resolveModel(name string) (string, error) {
	if s.models == nil {
		return "", nil
	}
	n, err := s.models.Resolve(name)
	if err != nil {
		if n2, ok := s.ollamaAlias(name); ok {
			return n2, nil
		}
		return "", err
	}
	return n, nil
}

// withModel is ctx carrying model, unless model is "" (one model).
func withModel(ctx context.Context, model string) context.Context {
	if model == "" {
		return ctx
	}
	return parley.WithModel(ctx, model)
}

// ollamaAlias finds a served model by its Ollama-style name (see
// ollamaName), with or without its tag.
func (s *Server) ollamaAlias(name string) (string, bool) {
	name = strings.ToLower(strings.TrimSpace(name))
	for _, m := range s.models.Models() {
		full := ollamaName(m.Name)
		if name == full || name == strings.TrimSuffix(full, ":latest") {
			return m.Name, true
		}
	}
	return "", false
}

// withKeepAlive makes the request's context ask for keepAlive (Ollama's
// keep_alive) for its model.
func withKeepAlive(c echo.Context, d time.Duration) {
	r := c.Request()
	c.SetRequest(r.WithContext(parley.WithKeepAlive(r.Context(), d)))
}

// modelStatus is the named model's status (false when there is none).
func (s *Server) modelStatus(name string) (ModelStatus, bool) {
	for _, m := range s.models.Models() {
		if m.Name == name {
			return m, true
		}
	}
	return ModelStatus{}, false
}

// modelFor is the model a request's context carries: its name as clients
// see it and its facts. With one model, the loaded model.
func (s *Server) modelFor(ctx context.Context) (string, parley.ModelInfo) {
	if s.models != nil {
		name := parley.ModelFrom(ctx)
		if name == "" {
			name, _ = s.models.Resolve("")
		}
		m, _ := s.modelStatus(name)
		return name, m.Info
	}
	var info parley.ModelInfo
	if s.api.modelInfo != nil {
		info = s.api.modelInfo()
	}
	name := info.Name
	if name == "" {
		name = "parley"
	}
	return name, info
}

// modelsList is /v1/models with several models: OpenAI's list, each entry
// with Parley's state, size and settings besides.
type modelsListEntry struct {
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	ModelStatus
}

func (s *Server) modelsListEntry(m ModelStatus) modelsListEntry {
	return modelsListEntry{Object: "model", Created: s.api.mounted.Unix(), OwnedBy: "parley", ModelStatus: m}
}

func (s *Server) handleModelsList(c echo.Context) error {
	ms := s.modelsFor(c.Request(), s.models.Models())
	data := make([]modelsListEntry, 0, len(ms))
	for _, m := range ms {
		data = append(data, s.modelsListEntry(m))
	}
	return c.JSON(http.StatusOK, struct {
		Object string            `json:"object"`
		Data   []modelsListEntry `json:"data"`
	}{"list", data})
}

func (s *Server) handleModelsOne(c echo.Context) error {
	name, err := s.models.Resolve(c.Param("id"))
	if err != nil {
		return err
	}
	m, _ := s.modelStatus(name)
	if !s.operator(c.Request()) {
		m = redactStatus(m)
	}
	return c.JSON(http.StatusOK, s.modelsListEntry(m))
}

// mountAdmin adds the admin endpoints. They need the API key (--api-key):
// a server started without it refuses them (403), since loading and
// unloading models is not for whoever can reach the port, and so does one
// whose request came with a named user's key (--user), which reaches that
// user's conversations, not the server's models.
func (s *Server) mountAdmin(g *echo.Group) {
	g.POST("/admin/models/:name/load", s.handleAdminLoad)
	g.POST("/admin/models/:name/unload", s.handleAdminUnload)
}

func (s *Server) adminAllowed(c echo.Context) error {
	if s.cfg.APIKey == "" {
		return parley.Errorf(parley.EForbidden, "the admin endpoints need an API key: start the server with --api-key")
	}
	if parley.UserFrom(c.Request().Context()) != "" {
		return parley.Errorf(parley.EForbidden, "the admin endpoints need the server's --api-key, not a user's key")
	}
	return s.apiAvailable()
}

func (s *Server) handleAdminLoad(c echo.Context) error {
	if err := s.adminAllowed(c); err != nil {
		return err
	}
	name, err := s.models.Resolve(c.Param("name"))
	if err != nil {
		return err
	}
	start := time.Now()
	if err := s.models.Load(c.Request().Context(), name); err != nil {
		return err
	}
	s.log.Info("model loaded by admin", zap.String("model", name), zap.Duration("took", time.Since(start)))
	m, _ := s.modelStatus(name)
	return c.JSON(http.StatusOK, m)
}

func (s *Server) handleAdminUnload(c echo.Context) error {
	if err := s.adminAllowed(c); err != nil {
		return err
	}
	name, err := s.models.Resolve(c.Param("name"))
	if err != nil {
		return err
	}
	if err := s.models.Unload(name); err != nil {
		return err
	}
	s.log.Info("model unloaded by admin", zap.String("model", name))
	m, _ := s.modelStatus(name)
	return c.JSON(http.StatusOK, m)
}

// healthModels is /health's account of every model (nil with one model).
func (s *Server) healthModels(r *http.Request) []healthModel {
	if s.models == nil {
		return nil
	}
	var out []healthModel
	for _, m := range s.modelsFor(r, s.models.Models()) {
		out = append(out, healthModel{Name: m.Name, State: m.State, InFlight: m.InFlight, LastError: m.LastError})
	}
	return out
}

type healthModel struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	InFlight  int    `json:"replies_in_flight"`
	LastError string `json:"last_error,omitempty"`
}

// sseProgress shows a streamed request that waits for its model to load
// the load's progress: it begins the event stream and writes SSE comments
// (": loading model NAME 42%"), which every SSE client ignores, so the
// client sees bytes at once and proxies do not time the request out. It
// runs on the request's goroutine (the registry's wait).
func (s *Server) sseProgress(c echo.Context) parley.LoadProgress {
	var w *streamWriter
	last := -1
	return func(model string, frac float64) {
		pct := int(frac * 100)
		if pct == last {
			return
		}
		last = pct
		if w == nil {
			w = s.beginStream(c, "text/event-stream")
		}
		_ = w.write([]byte(fmt.Sprintf(": loading model %s %d%%\n\n", model, pct)))
	}
}

// sseError ends a stream that sseProgress began with err, as one data
// event carrying the error body the request would have had as JSON.
func (s *Server) sseError(c echo.Context, err error) {
	b, _ := json.Marshal(errorBodyFor(c.Request(), err))
	w := &streamWriter{res: c.Response(), rc: http.NewResponseController(c.Response().Writer), wait: s.cfg.WriteWait}
	_ = w.write([]byte("event: error\ndata: " + string(b) + "\n\n"))
}

// modelsCollector reports each model's residency at every scrape.
type modelsCollector struct {
	s                      *Server
	state, bytes, inFlight *prometheus.Desc
}

func (c *modelsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.state
	ch <- c.bytes
	ch <- c.inFlight
}

func (c *modelsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.s.models.Models() {
		loaded := 0.0
		if m.State == "loaded" {
			loaded = 1
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(m.SizeBytes), m.Name)
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, loaded, m.Name)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(m.InFlight), m.Name)
	}
}

// loadingMessage is the JSON-mode WebSocket message that shows a prompt
// waiting for its model to load.
type loadingMessage struct {
	Type     string  `json:"type"` // "loading"
	Model    string  `json:"model"`
	Progress float64 `json:"progress"` // 0 to 1
}

// The Responder and Tokenizer of a server with several models (cmd/parley's
// router) serve each request's model (ctx's); these are their per-request
// forms, which the helpers below prefer when they are there.
type (
	modelTokenizers interface {
		// TokenizerFor returns ctx's model's tokenizer, the model held
		// (loaded first if need be, else nil when it is not loaded)
		// until release.
		TokenizerFor(ctx context.Context, load bool) (t Tokenizer, release func(), err error)
	}
	modelTemplates interface {
		TemplateFor(ctx context.Context) chat.Template
	}
	modelCounters interface {
		CountTokensFor(ctx context.Context, key string, msgs []parley.Message, p parley.Params) (int, error)
	}
)

// tokenizerFor is the tokenizer of ctx's model (nil when the server has
// none), held until release.
func (s *Server) tokenizerFor(ctx context.Context) (Tokenizer, func(), error) {
	return s.tokenizerOf(ctx, true)
}

// tokenizerOf is tokenizerFor that, without load, does not load ctx's model
// for it (nil when the model is not loaded).
func (s *Server) tokenizerOf(ctx context.Context, load bool) (Tokenizer, func(), error) {
	if mt, ok := s.tok.(modelTokenizers); ok && s.models != nil {
		return mt.TokenizerFor(ctx, load)
	}
	return s.tok, func() {}, nil
}

// templateFor is the chat template of ctx's model; false when the
// responder does not tell it.
func (s *Server) templateFor(ctx context.Context) (chat.Template, bool) {
	if mt, ok := s.api.responder.(modelTemplates); ok && s.models != nil {
		return mt.TemplateFor(ctx), true
	}
	if t, ok := s.api.responder.(templater); ok {
		return t.Template(), true
	}
	return nil, false
}

// countTokens counts the prompt tokens of msgs for ctx's model; false when
// the responder cannot count.
func (s *Server) countTokens(ctx context.Context, key string, msgs []parley.Message, p parley.Params) (int, bool, error) {
	key = parley.ScopedKey(ctx, key) // the memo Reply keeps under the caller's scope
	if mc, ok := s.api.responder.(modelCounters); ok && s.models != nil {
		n, err := mc.CountTokensFor(ctx, key, msgs, p)
		return n, true, err
	}
	tc, ok := s.api.responder.(tokenCounter)
	if !ok {
		return 0, false, nil
	}
	n, err := tc.CountTokens(key, msgs, p)
	return n, true, err
}
