package web_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap/zaptest"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/web"
)

// metrics is one parsed scrape of /metrics.
type metrics map[string]*dto.MetricFamily

func parseMetrics(tb testing.TB, r io.Reader) metrics {
	tb.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		tb.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

func scrape(tb testing.TB, base string) metrics {
	tb.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		tb.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("scrape: status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		tb.Fatalf("scrape: content type %q", ct)
	}
	return parseMetrics(tb, resp.Body)
}

// scrapeHandler scrapes through the handler, for a server whose listener is closed.
func scrapeHandler(tb testing.TB, h http.Handler) metrics {
	tb.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Host = "127.0.0.1:8000" // httptest's example.com is not an allowed Host by default (DNS-rebinding guard)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		tb.Fatalf("scrape: status %d", rec.Code)
	}
	return parseMetrics(tb, rec.Body)
}

// find returns the series of name whose labels include the given pairs
// (name, value, name, value, ...), or nil.
func (m metrics) find(name string, labels ...string) *dto.Metric {
	fam := m[name]
	if fam == nil {
		return nil
	}
next:
	for _, s := range fam.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range s.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return s
	}
	return nil
}

// value is a counter's or gauge's value, or a histogram's sample count.
func (m metrics) value(tb testing.TB, name string, labels ...string) float64 {
	tb.Helper()
	s := m.find(name, labels...)
	if s == nil {
		tb.Fatalf("no series %s%v in the scrape", name, labels)
	}
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Histogram != nil:
		return float64(s.GetHistogram().GetSampleCount())
	}
	tb.Fatalf("%s: unexpected metric type", name)
	return 0
}

func TestMetricsFollowAConversation(t *testing.T) {
	s := openMetered(t, nil)
	base := s.srv.URL()
	before := scrape(t, base)

	// Facts that need no traffic.
	if got := before.value(t, "parley_ready"); got != 1 {
		t.Errorf("parley_ready %v, want 1", got)
	}
	if got := before.value(t, "parley_slots"); got != 2 {
		t.Errorf("parley_slots %v, want 2", got)
	}
	if got := before.value(t, "parley_model_load_seconds"); got <= 0 {
		t.Errorf("parley_model_load_seconds %v, want > 0", got)
	}
	if before.find("parley_model_info", "architecture", "llama", "template", "plain") == nil {
		t.Errorf("parley_model_info for a llama model rendered plain is missing: %v", before["parley_model_info"])
	}
	if before.find("process_resident_memory_bytes") == nil || before.find("go_goroutines") == nil {
		t.Error("process and Go runtime metrics are missing")
	}

	// A refused cross-origin upgrade counts as a refusal.
	if got := upgradeStatus(t, s.url+"/ws", http.Header{"Origin": {"https://evil.example"}}); got != http.StatusForbidden {
		t.Fatalf("cross-origin upgrade: want 403, got %d", got)
	}

	// A two-turn conversation and a reply cancelled by the client.
	ws := dial(t, s.url+"/ws?format=json", nil)
	if m := readJSON(t, ws); m.Type != "session" {
		t.Fatalf("first message %+v", m)
	}
	var dones []jsonmode.Message
	gaps := 0 // between the tokens of each reply, as streamed (and so as metered)
	for _, p := range []string{"Once upon a time", "And then?"} {
		ws.WriteJSON(map[string]any{"type": "prompt", "content": p, "params": map[string]any{"max_tokens": 8}})
		toks, done := readUntilDone(t, ws)
		if done.Type != "done" || len(toks) != done.Usage.CompletionTokens {
			t.Fatalf("%q: done %+v after %d tokens", p, done, len(toks))
		}
		dones = append(dones, done)
		gaps += len(toks) - 1
	}
	if dones[1].Usage.CachedPromptTokens == 0 {
		t.Fatalf("turn 2 reused nothing: %+v", dones[1].Usage)
	}
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Tell a long story", "params": map[string]any{"max_tokens": 400}})
	if m := readJSON(t, ws); m.Type != "token" {
		t.Fatalf("want a token first, got %+v", m)
	}
	ws.WriteJSON(map[string]any{"type": "cancel"})
	rest, cancelled := readUntilDone(t, ws)
	if cancelled.FinishReason != string(parley.FinishCancelled) {
		t.Fatalf("after cancel: %+v", cancelled)
	}
	dones = append(dones, cancelled)
	// A cancelled reply may have generated tokens that were never streamed.
	gaps += len(rest)

	after := scrape(t, base)
	delta := func(name string, labels ...string) float64 {
		return after.value(t, name, labels...) - before.value(t, name, labels...)
	}
	var completion, prompt, cached, replied int
	finishes := map[string]int{}
	for _, d := range dones {
		completion += d.Usage.CompletionTokens
		prompt += d.Usage.PromptTokens
		cached += d.Usage.CachedPromptTokens
		finishes[d.FinishReason]++
		if d.Usage.CompletionTokens > 0 {
			replied++
		}
	}
	if finishes["length"] == 0 {
		t.Fatalf("no reply ended by its cap: %v", finishes)
	}
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"parley_generated_tokens_total", nil, float64(completion)},
		{"parley_prompt_tokens_evaluated_total", nil, float64(prompt - cached)},
		{"parley_prompt_tokens_reused_total", nil, float64(cached)},
		{"parley_time_to_first_token_seconds", nil, float64(replied)},
		{"parley_token_latency_seconds", nil, float64(gaps)},
		{"parley_replies_cancelled_total", []string{"by", "client"}, 1},
		{"parley_replies_cancelled_total", []string{"by", "disconnect"}, 0},
		{"parley_refusals_total", []string{"cause", "forbidden"}, 1},
		{"parley_sessions_open", nil, 1},
		// The first turn had no history; the next two continued this
		// server's own (the cancelled one is kept: it streamed text).
		{"parley_session_turns_total", []string{"kv_cache", "new"}, 1},
		{"parley_session_turns_total", []string{"kv_cache", "warm"}, 2},
		{"parley_session_turns_total", []string{"kv_cache", "rebuilt"}, 0},
	}
	for _, f := range []parley.FinishReason{parley.FinishStop, parley.FinishLength, parley.FinishEOS, parley.FinishCancelled, parley.FinishError} {
		checks = append(checks, struct {
			name   string
			labels []string
			want   float64
		}{"parley_replies_total", []string{"finish", string(f)}, float64(finishes[string(f)])})
	}
	for _, c := range checks {
		if got := delta(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := after.value(t, "parley_generations_active"); got != 0 {
		t.Errorf("parley_generations_active %v after every reply ended", got)
	}
	if got := after.value(t, "parley_generations_queued"); got != 0 {
		t.Errorf("parley_generations_queued %v after every reply ended", got)
	}
	if h := after.find("parley_time_to_first_token_seconds").GetHistogram(); h.GetSampleSum() <= 0 {
		t.Errorf("time to first token sums to %v", h.GetSampleSum())
	}

	// A client that goes away mid-reply is a disconnect cancellation.
	ws2 := dial(t, s.url+"/ws?format=json", nil)
	readJSON(t, ws2)
	ws2.WriteJSON(map[string]any{"type": "prompt", "content": "Tell a long story", "params": map[string]any{"max_tokens": 400}})
	if m := readJSON(t, ws2); m.Type != "token" {
		t.Fatalf("want a token first, got %+v", m)
	}
	ws2.Close() // no close frame: the connection just drops
	eventually(t, "a disconnect cancellation", func() bool {
		return scrape(t, base).value(t, "parley_replies_cancelled_total", "by", "disconnect") == before.value(t, "parley_replies_cancelled_total", "by", "disconnect")+1
	})

	ws.Close()
	eventually(t, "sessions to close", func() bool {
		return scrape(t, base).value(t, "parley_sessions_open") == before.value(t, "parley_sessions_open")
	})
}

func TestMetricsCountShutdownCancellations(t *testing.T) {
	s := openMetered(t, func(c *web.Config) { c.DrainTimeout = time.Millisecond })
	ws := dial(t, s.url+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Tell a long story", "params": map[string]any{"max_tokens": 400}})
	if m := readJSON(t, ws); m.Type != "token" {
		t.Fatalf("want a token first, got %+v", m)
	}
	if err := s.srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Close has waited for the connection's goroutines: the count is final.
	m := scrapeHandler(t, s.srv.Handler())
	if got := m.value(t, "parley_replies_cancelled_total", "by", "shutdown"); got != 1 {
		t.Fatalf("shutdown cancellations %v, want 1", got)
	}
	if got := m.value(t, "parley_ready"); got != 0 {
		t.Fatalf("parley_ready %v while draining", got)
	}
}

func TestInfoReportsTheModel(t *testing.T) {
	s := openMetered(t, nil)
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(s.srv.URL() + "/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	info := s.engine.Info()
	want := map[string]any{
		"architecture":   "llama",
		"parameters":     float64(info.Parameters),
		"context_length": float64(512),
		"parallel":       float64(2),
		"quantization":   info.Quantization,
		"template":       "plain",
		"name":           info.Name,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("/info %s = %v, want %v", k, got[k], v)
		}
	}
	if got["parameters"].(float64) <= 0 || got["quantization"] == "" || got["version"] == "" || got["engine"] == "" {
		t.Errorf("/info lacks facts: %v", got)
	}
	// The server's sampling defaults and limits, for the chat page.
	defaults, _ := got["defaults"].(map[string]any)
	wantDefaults := map[string]any{"max_tokens": float64(48), "temperature": float64(0), "top_k": float64(40),
		"top_p": float64(0.95), "min_p": float64(0.05), "seed": float64(-1)}
	for k, v := range wantDefaults {
		if defaults[k] != v {
			t.Errorf("/info defaults.%s = %v, want %v (all: %v)", k, defaults[k], v, defaults)
		}
	}
	limits, _ := got["limits"].(map[string]any)
	if limits["max_tokens"] != float64(1024) || limits["context_length"] != float64(512) {
		t.Errorf("/info limits = %v, want max_tokens 1024, context_length 512", limits)
	}
}

// fixedInfo is a model that has "loaded" without an engine, for the
// lifecycle test, which needs no model.
func fixedInfo() web.Info {
	return web.Info{ModelInfo: parley.ModelInfo{
		Name: "tiny", Architecture: "llama", Parameters: 260_000, Quantization: "F32",
		ContextLength: 512, Parallel: 2, LoadTime: 1500 * time.Millisecond,
	}, Template: "plain"}
}

func TestHealthReadyInfoThroughTheLifecycle(t *testing.T) {
	// No sessions: the readiness gate must keep every route that needs them
	// closed until SetReady (a request that got through would panic).
	srv := web.New(web.Config{Addr: "127.0.0.1:0", DrainTimeout: time.Second}, nil,
		web.WithLogger(zaptest.NewLogger(t)),
		web.WithInfo(fixedInfo),
		web.WithRoutes(func(e *echo.Echo) {
			e.POST("/mounted", func(c echo.Context) error { return c.String(http.StatusOK, "ran") })
		}))
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	base := srv.URL()
	client := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader("x"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type probe struct {
		method, path string
		status       int
		body         string // a substring of the body
	}
	check := func(phase string, probes []probe) {
		t.Helper()
		for _, p := range probes {
			if status, body := do(p.method, p.path); status != p.status || !strings.Contains(body, p.body) {
				t.Errorf("%s: %s %s = %d %q, want %d with %q", phase, p.method, p.path, status, body, p.status, p.body)
			}
		}
	}

	// Loading.
	check("loading", []probe{
		{"GET", "/health", 503, `"status":"loading"`},
		{"GET", "/ready", 503, `"status":"loading"`},
		{"GET", "/info", 503, `"code":"unavailable"`},
		{"GET", "/metrics", 200, "parley_ready 0"},
		{"GET", "/", 200, "<html"},
		{"POST", "/mounted", 503, `"code":"unavailable"`},
	})
	for _, path := range []string{"/", "/ws"} {
		if got := upgradeStatus(t, "ws://"+srv.Addr()+path, nil); got != http.StatusServiceUnavailable {
			t.Errorf("loading: upgrade on %s = %d, want 503", path, got)
		}
	}
	m := scrape(t, base)
	if m.find("parley_model_info") != nil {
		t.Error("parley_model_info reported before the model loaded")
	}
	if got := m.value(t, "parley_refusals_total", "cause", "unavailable"); got != 4 {
		t.Errorf("unavailable refusals %v, want 4 (/info, two upgrades, one mounted route)", got)
	}

	// Loaded.
	srv.SetReady(true)
	check("ready", []probe{
		{"GET", "/health", 200, `"status":"ok"`},
		{"GET", "/ready", 200, `"status":"ok"`},
		{"GET", "/info", 200, `"architecture":"llama"`},
		{"POST", "/mounted", 200, "ran"},
	})
	_, body := do("GET", "/info")
	var info map[string]any
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"name": "tiny", "parameters": 260000.0, "quantization": "F32", "context_length": 512.0,
		"parallel": 2.0, "template": "plain"} {
		if info[k] != v {
			t.Errorf("/info %s = %v, want %v", k, info[k], v)
		}
	}
	if v, _ := info["version"].(string); v == "" {
		t.Errorf("/info has no version: %v", info)
	}
	m = scrape(t, base)
	if m.find("parley_model_info", "name", "tiny", "architecture", "llama", "quantization", "F32", "template", "plain") == nil {
		t.Errorf("parley_model_info: %v", m["parley_model_info"])
	}
	if got := m.value(t, "parley_model_load_seconds"); got != 1.5 {
		t.Errorf("parley_model_load_seconds %v, want 1.5", got)
	}
	if got := m.value(t, "parley_ready"); got != 1 {
		t.Errorf("parley_ready %v, want 1", got)
	}

	// Draining: alive, but not ready. The listener is closed by then, so
	// ask the handler directly.
	if err := srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []probe{
		{"GET", "/health", 200, `"status":"draining"`},
		{"GET", "/ready", 503, `"status":"draining"`},
	} {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(p.method, p.path, nil))
		if rec.Code != p.status || !strings.Contains(rec.Body.String(), p.body) {
			t.Errorf("draining: %s = %d %q, want %d with %q", p.path, rec.Code, rec.Body.String(), p.status, p.body)
		}
	}
}

func TestOpsEndpointsKeyAndHost(t *testing.T) {
	srv := web.New(web.Config{Addr: "127.0.0.1:0", APIKey: "s3cret", AllowedHosts: []string{"chat.example"}}, nil, web.WithInfo(fixedInfo))
	srv.SetReady(true)
	cases := []struct {
		path, host, bearer string
		want               int
	}{
		// Probes carry no key and address the server by IP.
		{"/health", "10.1.2.3:8000", "", http.StatusOK},
		{"/ready", "127.0.0.1:8000", "", http.StatusOK},
		// These describe the deployment: key and Host guard apply.
		{"/metrics", "chat.example", "", http.StatusUnauthorized},
		{"/info", "chat.example", "", http.StatusUnauthorized},
		{"/info", "chat.example", "wrong", http.StatusUnauthorized},
		{"/metrics", "chat.example", "s3cret", http.StatusOK},
		{"/info", "chat.example", "s3cret", http.StatusOK},
		{"/metrics", "10.1.2.3:8000", "s3cret", http.StatusForbidden},
	}
	for _, c := range cases {
		req := httptest.NewRequest(http.MethodGet, c.path, nil)
		req.Host = c.host
		if c.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+c.bearer)
		}
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s (Host %s, key %q): %d, want %d", c.path, c.host, c.bearer, rec.Code, c.want)
		}
	}
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Host = "chat.example"
	req.Header.Set("Authorization", "Bearer s3cret")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	m := parseMetrics(t, rec.Body)
	if got := m.value(t, "parley_refusals_total", "cause", "unauthorized"); got != 3 {
		t.Errorf("unauthorized refusals %v, want 3", got)
	}
	if got := m.value(t, "parley_refusals_total", "cause", "forbidden"); got != 1 {
		t.Errorf("forbidden refusals %v, want 1", got)
	}
}

// TestHealthReportsDevice: /health and /metrics say what the model runs on,
// from the engine's Info (static) and stats (memory, read at each request).
func TestHealthReportsDevice(t *testing.T) {
	info := fixedInfo()
	info.Device = parley.Device{Backend: "CUDA0", Name: "NVIDIA H100 80GB HBM3", Type: "gpu",
		MemoryTotal: 80 << 30, GPULayers: 17, LayersOffloaded: 17, LayersTotal: 17, FlashAttention: true}
	srv := web.New(web.Config{Addr: "127.0.0.1:0", DrainTimeout: time.Second}, nil,
		web.WithLogger(zaptest.NewLogger(t)),
		web.WithInfo(func() web.Info { return info }),
		web.WithEngineStats(func() web.EngineStats {
			return web.EngineStats{DeviceMemoryUsed: 7 << 30, DeviceMemoryTotal: 80 << 30}
		}))
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	srv.SetReady(true)
	resp, err := http.Get(srv.URL() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`"status":"ok"`, `"backend":"CUDA0"`, `"name":"NVIDIA H100 80GB HBM3"`, `"type":"gpu"`,
		`"layers_offloaded":17`, `"layers_total":17`, `"memory_used_bytes":7516192768`, `"memory_total_bytes":85899345920`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/health = %s, want %s in it", b, want)
		}
	}
	m := scrape(t, srv.URL())
	if got := m.value(t, "parley_device_info", "backend", "CUDA0", "type", "gpu"); got != 1 {
		t.Errorf("parley_device_info = %v, want 1", got)
	}
	for name, want := range map[string]float64{
		"parley_gpu_layers_offloaded":      17,
		"parley_model_layers":              17,
		"parley_device_memory_used_bytes":  7 << 30,
		"parley_device_memory_total_bytes": 80 << 30,
	} {
		if got := m.value(t, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
