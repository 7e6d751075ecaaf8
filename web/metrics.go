package web

import (
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/media"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// EngineStats is what /metrics reads from the engine at every scrape. It
// mirrors llm.Stats: web declares its own type because it must not import
// llm (cgo); the entry point adapts one to the other. Counters are
// cumulative since the engine started; gauges are the state right now.
type EngineStats struct {
	Slots             int           // KV-cache slots (replies that can generate at once)
	SlotsBusy         int           // slots running a reply
	Queued            int           // replies waiting for a slot
	PromptEvaluated   int64         // prompt tokens decoded
	PromptReused      int64         // prompt tokens served from the KV cache instead
	PromptCopied      int64         // of those, tokens copied from another slot's cache (a shared prefix)
	Preemptions       int64         // replies that stepped out of their slot for a client without one
	PreemptSwaps      int64         // of those, replies whose KV cache was copied out to come back with them
	TokensGenerated   int64         // tokens sampled
	Steps             int64         // decode steps
	Decoded           int64         // tokens in decode steps, every kind
	StepTime          time.Duration // time spent in decode steps
	SlowConsumerDrops int64         // replies ended because their reader stopped reading
	GrammarDeadEnds   int64         // replies ended because their grammar allowed no token
	OverStepBudget    int64         // replies ended because one sampling step took longer than the step budget
	DeviceMemoryUsed  uint64        // bytes in use on the device the model runs on (total less free: other processes count too)
	DeviceMemoryTotal uint64        // bytes of memory of that device
	KVCache           KVCacheStats  // the swap of sessions' KV state (metrics_kv.go)
	Images            ImageStats    // images encoded and reused (metrics_images.go)
}

// WithEngineStats makes /metrics report the engine's counters; stats is
// called at every scrape, from the scraping goroutine, so it must be safe
// for concurrent use. Before the model has loaded it should return zeros.
func WithEngineStats(stats func() EngineStats) Option {
	return func(s *Server) { s.ops().stats = stats }
}

// Refusal causes (label "cause" of parley_refusals_total). Most are the
// error code of the refusal; the connection caps and the per-connection
// prompt queue have finer causes than their codes (see withCause).
const (
	refusedConns        = "conns"             // the global connection cap (code busy)
	refusedConnsPerIP   = "conns_per_ip"      // the per-address connection cap (code rate_limited)
	refusedRate         = "rate_limited"      // prompts per minute on one connection
	refusedQueueFull    = "queue_full"        // too many prompts waiting on one connection (code busy)
	refusedPromptTokens = "prompt_tokens"     // a prompt over the prompt-token cap (code too_large)
	refusedMessageSize  = "message_too_large" // a WebSocket message over the size limit (closed with 1009)
)

// refusalCodes returns the error codes that count as refusals: the server
// declined a request it understood, because of a limit, a policy or its
// state. Invalid requests, unknown sessions and internal errors are not
// refusals.
func refusalCodes() []string {
	return []string{
		parley.EBusy, parley.ERateLimited, parley.ETooLarge,
		parley.EUnauthorized, parley.EForbidden, parley.EUnavailable,
		parley.EStoreFull,
	}
}

// ops holds what the operational endpoints (/metrics, /info, /ready) need.
// Options fill stats and info before New builds the rest.
type ops struct {
	stats           func() EngineStats   // nil: no engine metrics
	storeUsage      func() session.Usage // nil: no store byte metrics (budgetmetrics.go)
	imageStats      *media.Stats         // images refused and decoded (nil: zeros; metrics_images.go)
	info            func() Info          // nil: /info answers 404
	version, engine string               // from the build, for /info

	reg       *prometheus.Registry // private: no global registry
	handler   http.Handler         // serves reg in the text format
	ttft      prometheus.Histogram
	tokenGap  prometheus.Histogram
	replies   *prometheus.CounterVec // by finish reason
	cancelled *prometheus.CounterVec // by who cancelled
	refusals  *prometheus.CounterVec // by cause
	kvTurns   *prometheus.CounterVec // committed session turns, by KV cache state
	// With several models (admin.go): replies and time to first token
	// by model; nil with one model, whose metrics stay as they were.
	modelReplies *prometheus.CounterVec   // by model and finish reason
	modelTTFT    *prometheus.HistogramVec // by model
	// Speculative decoding's draft tokens by model (the loaded model's name
	// with one), counted at each reply's end: verified, held, rejected.
	drafted, draftAccepted, draftRejected *prometheus.CounterVec
}

// ops returns the server's ops, creating it for the options that fill it.
// Only New (and the options it runs) call it before initOps.
func (s *Server) ops() *ops {
	if s.op == nil {
		s.op = &ops{}
	}
	return s.op
}

// initOps builds the metrics registry. Called once by New, after the options.
func (s *Server) initOps() {
	o := s.ops()
	o.reg = prometheus.NewRegistry()
	o.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "parley_time_to_first_token_seconds",
		Help: "Time from a reply's submission to its first generated token (queueing and prompt evaluation included).",
		// From a warm tiny model on loopback (milliseconds) to a long
		// prompt on a large model (tens of seconds).
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	})
	o.tokenGap = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "parley_token_latency_seconds",
		Help: "Time between consecutive tokens of a reply, as the server streams them.",
		// From thousands of tokens per second down to a slow model on a
		// busy CPU (about one per second).
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	o.replies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_replies_total",
		Help: "Replies finished, by finish reason (stop, length, eos, cancelled, error).",
	}, []string{"finish"})
	o.cancelled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_replies_cancelled_total",
		Help: "Replies cancelled, by who cancelled: client (explicit cancel), disconnect, slow_client, shutdown.",
	}, []string{"by"})
	o.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_refusals_total",
		Help: "Requests, connections and prompts refused, by cause.",
	}, []string{"cause"})
	o.kvTurns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_session_turns_total",
		Help: "Committed chat turns, by how they found the KV cache: new (no history), warm (this replica served the history and the engine reused it), rebuilt (history resumed from the store, e.g. written by another replica).",
	}, []string{"kv_cache"})
	for _, kv := range []string{session.KVNew, session.KVWarm, session.KVRebuilt} {
		o.kvTurns.WithLabelValues(kv)
	}
	// Every known label value starts at 0, so rate() and dashboards see the
	// series before the first event.
	for _, f := range []parley.FinishReason{parley.FinishStop, parley.FinishLength, parley.FinishEOS, parley.FinishCancelled, parley.FinishError} {
		o.replies.WithLabelValues(string(f))
	}
	for _, by := range []string{apicore.CancelByClient, apicore.CancelByDisconnect, apicore.CancelBySlowClient, apicore.CancelByShutdown} {
		o.cancelled.WithLabelValues(by)
	}
	for _, c := range append([]string{refusedConns, refusedConnsPerIP, refusedRate, refusedQueueFull, refusedPromptTokens, refusedMessageSize,
		refusedBodyBudget, refusedBodyShare, refusedHTTPConnsPerIP}, refusalCodes()...) {
		o.refusals.WithLabelValues(c)
	}

	draftVec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"model"})
	}
	o.drafted = draftVec("parley_draft_tokens_total",
		"Draft tokens speculative decoding (--draft) verified, by model: accepted plus rejected.")
	o.draftAccepted = draftVec("parley_draft_tokens_accepted_total",
		"Draft tokens that held, by model: each a token generated without a decode step of its own.")
	o.draftRejected = draftVec("parley_draft_tokens_rejected_total",
		"Draft tokens that did not hold (removed from the KV cache), by model.")
	cs := []prometheus.Collector{o.drafted, o.draftAccepted, o.draftRejected}
	if s.models != nil {
		o.modelReplies = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_model_replies_total",
			Help: "Replies finished, by model and finish reason (with several models).",
		}, []string{"model", "finish"})
		o.modelTTFT = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "parley_model_time_to_first_token_seconds",
			Help:    "Time from a reply's submission to its first generated token, by model (with several models; a load it waited for is not included).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"model"})
		cs = append(cs, o.modelReplies, o.modelTTFT, &modelsCollector{s: s,
			state:    prometheus.NewDesc("parley_model_loaded", "1 for each model loaded now, 0 for the others (with several models).", []string{"model"}, nil),
			bytes:    prometheus.NewDesc("parley_model_resident_bytes", "The memory estimate of each model loaded now (file, KV cache, compute buffers).", []string{"model"}, nil),
			inFlight: prometheus.NewDesc("parley_model_replies_in_flight", "Replies each model is generating (they hold it loaded).", []string{"model"}, nil),
		})
	}
	cs = append(cs,
		o.ttft, o.tokenGap, o.replies, o.cancelled, o.refusals, o.kvTurns,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_sessions_open",
			Help: "Open WebSocket connections (chat sessions and Responses API sockets).",
		}, func() float64 { return float64(s.OpenConns()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_ready",
			Help: "1 when the model is loaded and the server is not draining, else 0.",
		}, func() float64 { return b2f(s.isReady()) }),
		&modelCollector{s: s, info: prometheus.NewDesc("parley_model_info",
			"The loaded model (value 1); absent while loading.",
			[]string{"name", "architecture", "quantization", "template", "version"}, nil),
			device: prometheus.NewDesc("parley_device_info",
				"The device the model runs on (value 1): backend (CUDA0, CPU), name, type (gpu, cpu); absent while loading.",
				[]string{"backend", "name", "type"}, nil),
			layers: prometheus.NewDesc("parley_gpu_layers_offloaded",
				"Model layers (blocks and output head) offloaded to the GPU; 0 on the CPU. Absent while loading.", nil, nil),
			layersTotal: prometheus.NewDesc("parley_model_layers",
				"Offloadable layers of the model (blocks plus the output head). Absent while loading.", nil, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_model_load_seconds",
			Help: "How long loading the model took (0 while loading).",
		}, func() float64 {
			if !s.ready.Load() || o.info == nil {
				return 0
			}
			return o.info().LoadTime.Seconds()
		}),
	)
	if o.stats != nil {
		cs = append(cs, engineCollectors(o.stats)...)
		cs = append(cs, kvCollectors(o.stats)...)
	}
	cs = append(cs, imageCollectors(o.stats, o.imageStats)...)
	cs = append(cs, s.budgetCollectors()...)
	// The names are distinct constants, so registration fails only on a
	// programming error, which the package's tests catch.
	o.reg.MustRegister(cs...)
	o.handler = promhttp.HandlerFor(o.reg, promhttp.HandlerOpts{
		// A failing collector reports its error in the scrape and the rest
		// is still served, rather than failing the whole scrape.
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// engineCollectors reads the engine's own counters at scrape time, so the
// numbers are the engine's and nothing is counted twice.
func engineCollectors(stats func() EngineStats) []prometheus.Collector {
	gauge := func(name, help string, v func(EngineStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(stats()) })
	}
	counter := func(name, help string, v func(EngineStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return v(stats()) })
	}
	return []prometheus.Collector{
		gauge("parley_generations_active", "Replies generating now; each holds one KV-cache slot, so this is also the slots in use.",
			func(s EngineStats) float64 { return float64(s.SlotsBusy) }),
		gauge("parley_generations_queued", "Replies waiting for a free slot.",
			func(s EngineStats) float64 { return float64(s.Queued) }),
		gauge("parley_slots", "KV-cache slots: replies that can generate at once (--parallel).",
			func(s EngineStats) float64 { return float64(s.Slots) }),
		counter("parley_prompt_tokens_evaluated_total", "Prompt tokens decoded by the model.",
			func(s EngineStats) float64 { return float64(s.PromptEvaluated) }),
		counter("parley_prompt_tokens_reused_total", "Prompt tokens served from a slot's KV cache instead of being decoded again.",
			func(s EngineStats) float64 { return float64(s.PromptReused) }),
		counter("parley_prompt_tokens_copied_total", "Prompt tokens copied from another slot's KV cache (a shared prefix such as a system prompt) instead of being decoded.",
			func(s EngineStats) float64 { return float64(s.PromptCopied) }),
		counter("parley_preemptions_total", "Replies that stepped out of their slot for a client that had none, and went on later (fair sharing).",
			func(s EngineStats) float64 { return float64(s.Preemptions) }),
		counter("parley_preemption_swaps_total", "Of the replies that stepped out, those whose KV cache was copied out of the slot and put back when they went on (instead of evaluating their history again).",
			func(s EngineStats) float64 { return float64(s.PreemptSwaps) }),
		counter("parley_generated_tokens_total", "Tokens generated (end-of-generation tokens not included).",
			func(s EngineStats) float64 { return float64(s.TokensGenerated) }),
		counter("parley_decode_steps_total", "llama.cpp decode steps (each one batch across all active replies).",
			func(s EngineStats) float64 { return float64(s.Steps) }),
		counter("parley_decoded_tokens_total", "Tokens in decode steps, every kind: prompts, histories evaluated again after stepping out, generated tokens and draft tokens.",
			func(s EngineStats) float64 { return float64(s.Decoded) }),
		counter("parley_decode_seconds_total", "Time spent in decode steps.",
			func(s EngineStats) float64 { return s.StepTime.Seconds() }),
		counter("parley_slow_consumer_drops_total", "Replies the engine ended because nothing was reading them.",
			func(s EngineStats) float64 { return float64(s.SlowConsumerDrops) }),
		counter("parley_grammar_dead_ends_total", "Replies ended because their grammar allowed no token of the model's vocabulary.",
			func(s EngineStats) float64 { return float64(s.GrammarDeadEnds) }),
		counter("parley_step_budget_exceeded_total", "Replies ended because one sampling step took longer than --step-budget.",
			func(s EngineStats) float64 { return float64(s.OverStepBudget) }),
		gauge("parley_device_memory_used_bytes", "Memory in use on the device the model runs on (total less free, other processes included); 0 on the CPU.",
			func(s EngineStats) float64 { return float64(s.DeviceMemoryUsed) }),
		gauge("parley_device_memory_total_bytes", "Memory of the device the model runs on; 0 on the CPU.",
			func(s EngineStats) float64 { return float64(s.DeviceMemoryTotal) }),
	}
}

// modelCollector reports parley_model_info once the model has loaded; its
// labels are only known then, so it cannot be a labelled GaugeFunc.
type modelCollector struct {
	s                                 *Server
	info, device, layers, layersTotal *prometheus.Desc
}

func (c *modelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.info
	ch <- c.device
	ch <- c.layers
	ch <- c.layersTotal
}

func (c *modelCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.s.ready.Load() || c.s.op.info == nil {
		return
	}
	in := c.s.info()
	m, err := prometheus.NewConstMetric(c.info, prometheus.GaugeValue, 1,
		in.Name, in.Architecture, in.Quantization, in.Template, in.Version)
	if err != nil {
		m = prometheus.NewInvalidMetric(c.info, err)
	}
	ch <- m
	d := in.Device
	if d.Backend == "" {
		return // an engine that does not say (a test fake)
	}
	ch <- prometheus.MustNewConstMetric(c.device, prometheus.GaugeValue, 1, d.Backend, d.Name, d.Type)
	ch <- prometheus.MustNewConstMetric(c.layers, prometheus.GaugeValue, float64(d.LayersOffloaded))
	ch <- prometheus.MustNewConstMetric(c.layersTotal, prometheus.GaugeValue, float64(d.LayersTotal))
}

func (s *Server) handleMetrics(c echo.Context) error {
	s.op.handler.ServeHTTP(c.Response(), c.Request())
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// replyMeter records one streamed reply in the metrics: the gap between
// consecutive tokens, and at the final event the finish reason, the time to
// first token and, for a cancelled reply, who cancelled it. One meter per
// reply, used only by the goroutine that reads the reply's events.
//
// Every place that streams a reply (the WebSocket worker, the HTTP
// endpoints) passes each event to observe:
//
//	meter := s.meterReply(s.requestCancelCause)
//	for ev := range reply.Events() {
//		meter.Observe(ev)
//		...
//	}
type replyMeter struct {
	o           *ops
	cancelCause func() string
	last        time.Time // when the previous token arrived; zero before the first
	model       string    // with several models, the reply's ("" with one)
}

// forModel makes the meter count the reply for model too, with several
// models (the reply's model; "" does nothing).
func (r *replyMeter) forModel(model string) *replyMeter {
	r.model = model
	return r
}

// meterReply starts a meter. cancelCause says who cancelled the reply; it is
// called only when the reply finishes as cancelled.
func (s *Server) meterReply(cancelCause func() string) *replyMeter {
	return &replyMeter{o: s.op, cancelCause: cancelCause}
}

// observe records one event of the reply.
func (r *replyMeter) Observe(ev parley.Event) {
	now := time.Now()
	if !ev.Done {
		if !r.last.IsZero() {
			r.o.tokenGap.Observe(now.Sub(r.last).Seconds())
		}
		r.last = now
		return
	}
	r.o.replies.WithLabelValues(string(ev.Finish)).Inc()
	if ev.Usage.CompletionTokens > 0 && ev.Timings.TimeToFirstToken > 0 {
		r.o.ttft.Observe(ev.Timings.TimeToFirstToken.Seconds())
	}
	if r.model != "" && r.o.modelReplies != nil {
		r.o.modelReplies.WithLabelValues(r.model, string(ev.Finish)).Inc()
		if ev.Usage.CompletionTokens > 0 && ev.Timings.TimeToFirstToken > 0 {
			r.o.modelTTFT.WithLabelValues(r.model).Observe(ev.Timings.TimeToFirstToken.Seconds())
		}
	}
	if ev.Finish == parley.FinishCancelled {
		r.o.cancelled.WithLabelValues(r.cancelCause()).Inc()
	}
	if t := ev.Timings; t.Drafted > 0 {
		model := r.model
		if model == "" && r.o.info != nil {
			model = r.o.info().Name
		}
		r.o.drafted.WithLabelValues(model).Add(float64(t.Drafted))
		r.o.draftAccepted.WithLabelValues(model).Add(float64(t.DraftAccepted))
		r.o.draftRejected.WithLabelValues(model).Add(float64(t.Drafted - t.DraftAccepted))
	}
}

// requestCancelCause is the cancel cause of a reply streamed over HTTP: its
// request has no cancel message, so a cancelled reply lost its client, or
// the server is shutting down.
func (s *Server) requestCancelCause() string {
	if s.draining.Load() {
		return apicore.CancelByShutdown
	}
	return apicore.CancelByDisconnect
}

// causeError tags a refusal with a cause finer than its error code, for
// parley_refusals_total. It wraps the *parley.Error, so the code, status
// and message the client sees are unchanged.
type causeError struct {
	cause string
	err   error
}

func (e *causeError) Error() string { return e.err.Error() }
func (e *causeError) Unwrap() error { return e.err }

// withCause tags err with a refusal cause.
func withCause(cause string, err error) error { return &causeError{cause: cause, err: err} }

// refused counts one refusal under cause.
func (s *Server) refused(cause string) { s.op.refusals.WithLabelValues(cause).Inc() }

// countRefusal counts err in parley_refusals_total if it is a refusal: a
// tagged error under its cause, an error whose code is in refusalCodes under
// its code. Anything else (invalid input, internal errors) is not counted.
func (s *Server) countRefusal(err error) {
	var ce *causeError
	if errors.As(err, &ce) {
		s.refused(ce.cause)
		return
	}
	if code := parley.ErrorCode(err); slices.Contains(refusalCodes(), code) {
		s.refused(code)
	}
}

// countRefusals is the outermost middleware: it counts every refusal an
// HTTP handler (or a middleware inside it) returns, before the error
// handler renders it.
func (s *Server) countRefusals(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		err := next(c)
		if err != nil {
			s.countRefusal(err) // echo's own errors (404, 405) have no refusal code
		}
		return err
	}
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
