package web

import (
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
)

// Info is what GET /info reports: the loaded model's facts, the prompt
// format replies are rendered with, and the versions that served them.
type Info struct {
	parley.ModelInfo
	Template string `json:"template"` // the prompt format in use: jinja (the model's own), a chat template family, or "plain"
	Version  string `json:"version"`  // Parley's version (filled by the server from the build)
	Engine   string `json:"engine"`   // the llama.cpp that runs: as the caller names it, else the binding's module and version (filled by the server)
	// Thinking is how the model marks its thought (think-tags, harmony, channel), "none" for a model without one.
	Thinking string `json:"thinking,omitempty"`
	// Defaults are the sampling parameters a request gets for each one it
	// leaves out (the server's flags), and Limits what a request may ask
	// for: the chat page shows both and sends only what its user changed.
	Defaults *InfoDefaults `json:"defaults,omitempty"`
	Limits   *InfoLimits   `json:"limits,omitempty"`
	// Models is, with several models, each one's state and the engine
	// that runs it while it is loaded (the server fills it); ModelInfo and
	// Engine above are the default model's.
	Models []InfoModel `json:"models,omitempty"`
}

// InfoModel is one of several models as /info reports it.
type InfoModel struct {
	Name    string `json:"name"`
	Default bool   `json:"default,omitempty"`
	State   string `json:"state"`            // unloaded, loading, loaded, unloading
	Engine  string `json:"engine,omitempty"` // the llama.cpp that runs it, while it is loaded
}

// InfoDefaults is /info's account of the server's sampling defaults.
type InfoDefaults struct {
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	TopK        int     `json:"top_k"`
	TopP        float64 `json:"top_p"`
	MinP        float64 `json:"min_p"`
	Seed        int64   `json:"seed"`
}

// InfoLimits is /info's account of what a request may ask for.
type InfoLimits struct {
	MaxTokens     int `json:"max_tokens"`     // the largest max_tokens (--max-tokens-limit)
	ContextLength int `json:"context_length"` // tokens of one conversation's window: prompt and reply together
}

// WithInfo makes GET /info and parley_model_info report the loaded model.
// info is called only once the server is ready (SetReady(true)), so it may
// depend on things that exist only after the model has loaded; it fills
// ModelInfo and Template (and Engine, when the caller knows which runs),
// and the server fills Version and, unless set, Engine.
func WithInfo(info func() Info) Option {
	return func(s *Server) { s.ops().info = info }
}

// bindingModule is the module whose version /info reports as the engine.
const bindingModule = "github.com/ollama/ollama"

// BuildVersions is Parley's version and the llama.cpp binding's, as /info
// reports them (see buildVersions).
func BuildVersions() (version, engine string) { return buildVersions() }

// buildVersions reads Parley's version and the llama.cpp binding's from
// the binary's build information. A build from a work tree (no module
// version) reports "devel", with the VCS revision when the build recorded one.
func buildVersions() (version, engine string) {
	version, engine = "devel", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, engine
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		version = v
	} else {
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" && st.Value != "" {
				version = "devel+" + st.Value[:min(12, len(st.Value))]
			}
		}
	}
	for _, d := range bi.Deps {
		if d.Path == bindingModule {
			engine = d.Path + "/llama " + d.Version
		}
	}
	return version, engine
}

// info returns the full /info document. Call only when ready and o.info is set.
func (s *Server) info() Info {
	in := s.op.info()
	in.Version = s.op.version
	if in.Engine == "" {
		in.Engine = s.op.engine
	}
	d := s.cfg.Defaults
	in.Defaults = &InfoDefaults{MaxTokens: d.MaxTokens, Temperature: d.Temperature, TopK: d.TopK, TopP: d.TopP,
		MinP: d.MinP, Seed: d.Seed}
	in.Limits = &InfoLimits{MaxTokens: s.cfg.MaxTokensCap, ContextLength: in.ContextLength}
	return in
}

// isReady reports whether the server takes new work: the model is loaded
// and Close has not begun.
func (s *Server) isReady() bool { return s.ready.Load() && !s.draining.Load() }

// opsRoutes mounts the operational endpoints. /health and /ready stay open
// to probes without the API key; /metrics and /info need the key when one
// is set, because they describe the deployment.
func (s *Server) opsRoutes(e *echo.Echo) {
	s.op.version, s.op.engine = buildVersions()
	e.GET("/health", s.handleHealth)
	e.GET("/ready", s.handleReady)
	e.GET("/info", s.handleInfo, s.RequireKey)
	e.GET("/metrics", s.handleMetrics, s.RequireKey)
}

// statusBody is the JSON of /health and /ready.
type statusBody struct {
	Status string        `json:"status"`           // loading, ok or draining
	Device *deviceStatus `json:"device,omitempty"` // where the model runs, once loaded (/health only)
	Models []healthModel `json:"models,omitempty"` // with several models, each one's state (/health only)
}

// deviceStatus is /health's account of the device: what the model runs on,
// how much of it is offloaded, and the device's memory now.
type deviceStatus struct {
	Backend         string `json:"backend"` // CUDA0, CPU
	Name            string `json:"name"`
	Type            string `json:"type"` // gpu or cpu
	LayersOffloaded int    `json:"layers_offloaded"`
	LayersTotal     int    `json:"layers_total"`
	HugePages       uint64 `json:"huge_pages_bytes,omitempty"` // weights on 2 MiB pages (CPU, --huge-pages)
	MemoryUsed      uint64 `json:"memory_used_bytes,omitempty"`
	MemoryTotal     uint64 `json:"memory_total_bytes,omitempty"`
}

// deviceStatus reads the device for /health; nil when the server has no
// model information or the engine does not name its device.
func (s *Server) deviceStatus() *deviceStatus {
	if s.op.info == nil {
		return nil
	}
	d := s.op.info().Device
	if d.Backend == "" {
		return nil
	}
	ds := &deviceStatus{Backend: d.Backend, Name: d.Name, Type: d.Type,
		LayersOffloaded: d.LayersOffloaded, LayersTotal: d.LayersTotal, HugePages: d.HugePagesBytes}
	if s.op.stats != nil {
		st := s.op.stats()
		ds.MemoryUsed, ds.MemoryTotal = st.DeviceMemoryUsed, st.DeviceMemoryTotal
	}
	return ds
}

// handleHealth is liveness: 503 while the model loads, 200 once it has
// loaded, draining included (a draining server is alive and finishing its
// replies; restarting it then would cut them off).
//
// Without an accepted API key (when one is configured) it says only its
// status: the device, the models, their replies in flight and their load
// errors describe the deployment (see redact.go).
func (s *Server) handleHealth(c echo.Context) error {
	status := "ok"
	switch {
	case !s.ready.Load():
		return c.JSON(http.StatusServiceUnavailable, statusBody{Status: "loading"})
	case s.draining.Load():
		status = "draining"
	}
	if !s.authorized(c.Request()) {
		return c.JSON(http.StatusOK, statusBody{Status: status})
	}
	return c.JSON(http.StatusOK, statusBody{Status: status, Device: s.deviceStatus(), Models: s.healthModels(c.Request())})
}

// handleReady is readiness: 200 only while the server takes new work, so a
// load balancer sends nothing to a server that is loading or draining.
func (s *Server) handleReady(c echo.Context) error {
	switch {
	case !s.ready.Load():
		return c.JSON(http.StatusServiceUnavailable, statusBody{Status: "loading"})
	case s.draining.Load():
		return c.JSON(http.StatusServiceUnavailable, statusBody{Status: "draining"})
	}
	return c.JSON(http.StatusOK, statusBody{Status: "ok"})
}

func (s *Server) handleInfo(c echo.Context) error {
	if s.op.info == nil {
		return parley.Errorf(parley.ENotFound, "this server reports no model information")
	}
	if !s.ready.Load() {
		return parley.Errorf(parley.EUnavailable, "the model is loading")
	}
	in := s.info()
	if !s.operator(c.Request()) {
		in.Path = baseName(in.Path)
	}
	if s.models != nil {
		for _, m := range s.modelsFor(c.Request(), s.models.Models()) {
			in.Models = append(in.Models, InfoModel{Name: m.Name, Default: m.Default, State: m.State, Engine: m.Engine})
		}
	}
	return c.JSON(http.StatusOK, in)
}

// requireReady answers 503 unavailable on every route that needs the model
// until SetReady(true): the WebSocket chat and every HTTP API, including
// routes mounted later by other files, so none of them runs before the
// engine exists. The operational endpoints and the chat page (which
// reconnects by itself) are served while loading.
func (s *Server) requireReady(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.ready.Load() || servedWhileLoading(c) {
			return next(c)
		}
		return parley.Errorf(parley.EUnavailable, "the model is loading; try again shortly")
	}
}

// isProbe reports whether c is a health or readiness probe. Probes are
// answered whatever their Host header: container and orchestrator probes
// address the server by IP (Host 127.0.0.1:8000, a pod IP), and the two
// answers reveal nothing a rebinding page could use.
func isProbe(c echo.Context) bool {
	p := c.Path()
	return (p == "/health" || p == "/ready") && c.Request().Method == http.MethodGet
}

func servedWhileLoading(c echo.Context) bool {
	r := c.Request()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch p := c.Path(); {
	case p == "/health", p == "/ready", p == "/info", p == "/metrics", strings.HasPrefix(p, "/ui/"):
		return true
	case p == "/":
		return !websocket.IsWebSocketUpgrade(r)
	}
	return false
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
