package web_test

// The real stack every end-to-end test of this package runs on, and the
// helpers that talk to it: stories260K through llama.cpp, chat, session and
// a web.Server on a loopback port, built in one place (openStack) so that
// every test exercises the same wiring.

import (
	"context"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

// recorder wraps the session service and remembers each turn's rendered
// prompt, so tests can prove what the model was given.
type recorder struct {
	*session.Service
	mu      sync.Mutex
	prompts []string
}

func (r *recorder) Turn(ctx context.Context, who parley.Caller, id, prompt string, p parley.Params, opts ...session.TurnOption) (*session.Turn, error) {
	t, err := r.Service.Turn(ctx, who, id, prompt, p, opts...)
	if err == nil {
		r.mu.Lock()
		r.prompts = append(r.prompts, t.Prompt())
		r.mu.Unlock()
	}
	return t, err
}

func (r *recorder) Prompts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.prompts...)
}

// stack is one running real stack.
type stack struct {
	srv       *web.Server
	sessions  *recorder
	engine    *llm.Engine
	responder *chat.Responder
	url       string                 // ws://host:port
	base      string                 // http://host:port
	logs      *observer.ObservedLogs // the server's log lines at Info and above
}

// stackOpts varies the stack; the zero value is the default one.
type stackOpts struct {
	parallel     int   // engine slots (default 2)
	cacheSlots   int   // KV-cache slots kept (default: parallel)
	kvCacheRAM   int64 // bytes of swapped-out KV state kept in memory (default 0: no swap)
	contextLen   int   // tokens per slot (default 512)
	maxTokens    int   // the sessions' and the server's default reply cap (default 48)
	maxTokensCap int   // Config.MaxTokensCap (default 1024)
	tokenizer    bool  // give the server the engine as its Tokenizer
	sndbuf       int   // > 0: the server's sockets get this send buffer (no autotuning)
	cfg          func(*web.Config)
	// generator, when set, wraps the engine the responder generates with.
	generator func(*llm.Engine) chat.Generator
	// options adds server options that need the engine or the responder
	// (called once both exist, before web.New).
	options func(*stack) []web.Option
	store   session.Store    // the sessions' store (default: a new memory store); closed at cleanup
	svcOpts []session.Option // more options of the session service
	// wrapStore, when set, wraps the store the service writes (a test's
	// faults); the cleanup closes the store, not the wrapper.
	wrapStore func(session.Store) session.Store
	model     string // the GGUF to load (default stories260K)
	draft     string // the engine's speculative decoding (llm.Config.Draft; default off)
}

// openStack starts the real stack on a loopback port; tb's cleanup closes
// the server, the store and the engine, in that order. Sampling defaults
// are greedy, so replies are reproducible.
func openStack(tb testing.TB, o stackOpts) *stack {
	tb.Helper()
	if o.parallel == 0 {
		o.parallel = 2
	}
	if o.maxTokens == 0 {
		o.maxTokens = 48
	}
	if o.maxTokensCap == 0 {
		o.maxTokensCap = 1024
	}
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(tb).Core(), core))
	// Cleanups run last first: the server, then the store, then the engine.
	if o.model == "" {
		o.model = testmodel.Path(tb)
	}
	if o.contextLen == 0 {
		o.contextLen = 512
	}
	// PARLEY_TEST_ENGINE runs the suite on another engine (scripts/test.sh
	// runs it once per engine); the current engine's libraries come from
	// PARLEY_ENGINE_LIB.
	eng, err := llm.Open(llm.Config{Path: o.model, ContextLength: o.contextLen, Parallel: o.parallel, CacheSlots: o.cacheSlots, KVCache: llm.KVCacheConfig{RAMBytes: o.kvCacheRAM}, Threads: 1, Logger: log,
		Engine: os.Getenv("PARLEY_TEST_ENGINE"), Draft: o.draft})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { eng.Close() })
	var gen chat.Generator = eng
	if o.generator != nil {
		gen = o.generator(eng)
	}
	resp := chat.NewResponder(gen, chat.WithLogger(log))
	store := o.store
	if store == nil {
		store = session.NewMemoryStore()
	}
	tb.Cleanup(func() { store.Close() })
	if o.wrapStore != nil {
		store = o.wrapStore(store)
	}
	defaults := parley.DefaultParams()
	defaults.Temperature = 0
	defaults.MaxTokens = o.maxTokens
	svcOpts := append([]session.Option{session.WithDefaultParams(defaults), session.WithLogger(log)}, o.svcOpts...)
	rec := &recorder{Service: session.NewService(store, resp, svcOpts...)}
	// cfg.Defaults is a copy: a test's cfg tweak of the server's defaults
	// leaves the sessions' defaults as they are.
	cfg := web.Config{Addr: "127.0.0.1:0", Defaults: defaults, MaxTokensCap: o.maxTokensCap, DrainTimeout: 2 * time.Second}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	s := &stack{sessions: rec, engine: eng, responder: resp, logs: logs}
	opts := []web.Option{web.WithLogger(log)}
	if o.tokenizer {
		opts = append(opts, web.WithTokenizer(eng))
	}
	if o.options != nil {
		opts = append(opts, o.options(s)...)
	}
	srv := web.New(cfg, rec, opts...)
	if o.sndbuf > 0 {
		ln, err := net.Listen("tcp", cfg.Addr)
		if err != nil {
			tb.Fatal(err)
		}
		srv.OpenListener(sndbufListener{ln, o.sndbuf})
	} else if err := srv.Open(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Close(context.Background()) })
	srv.SetReady(true)
	s.srv, s.url, s.base = srv, "ws://"+srv.Addr(), srv.URL()
	return s
}

// openMetered is the stack with the engine's counters and the model's facts
// wired the way cmd/parley wires them.
func openMetered(tb testing.TB, mod func(*web.Config)) *stack {
	tb.Helper()
	return openStack(tb, stackOpts{cfg: mod, options: func(s *stack) []web.Option {
		return []web.Option{
			web.WithEngineStats(func() web.EngineStats {
				st := s.engine.Stats()
				return web.EngineStats{
					Slots: st.Slots, SlotsBusy: st.SlotsBusy, Queued: st.Queued,
					PromptEvaluated: st.PromptEvaluated, PromptReused: st.PromptReused, TokensGenerated: st.TokensGenerated,
					Steps: st.Steps, StepTime: time.Duration(st.StepNanos), SlowConsumerDrops: st.SlowConsumerDrop,
				}
			}),
			web.WithInfo(func() web.Info { return web.Info{ModelInfo: s.engine.Info(), Template: s.responder.Template().Name()} }),
		}
	}})
}

// mustOpenAPI is the stack with the HTTP APIs mounted: short replies (24
// tokens by default, at most 480) and the prompt-token counter.
func mustOpenAPI(tb testing.TB, mod func(*web.Config)) *stack {
	tb.Helper()
	return openStack(tb, stackOpts{maxTokens: 24, maxTokensCap: 480, tokenizer: true, cfg: mod, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
}

// sndbufListener sets each accepted socket's send buffer, so the kernel
// holds little of what the server writes to a client that does not read.
type sndbufListener struct {
	net.Listener
	size int
}

func (l sndbufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(l.size)
	}
	return c, err
}

// logged counts the server's log lines with this message.
func (s *stack) logged(msg string) int { return s.logs.FilterMessage(msg).Len() }

// replyLogs returns the "reply" log records of route.
func (s *stack) replyLogs(route string) []map[string]any {
	var out []map[string]any
	for _, e := range s.logs.FilterMessage("reply").All() {
		m := e.ContextMap()
		if m["route"] == route {
			out = append(out, m)
		}
	}
	return out
}

// hangWait bounds the waits for something that must happen: it only
// catches a hang, so it is minutes, far past the slowest machine's time
// (a test waits for the event, never for a time window).
const hangWait = 2 * time.Minute

// waitIdle waits until the engine has no slot busy.
func (s *stack) waitIdle(tb testing.TB) {
	tb.Helper()
	if !waitFor(hangWait, func() bool { return s.engine.Stats().SlotsBusy == 0 }) {
		tb.Fatalf("engine still busy: %+v", s.engine.Stats())
	}
}

// waitFor polls cond until it holds or d passes, and reports whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// eventually polls cond until it holds, failing the test after hangWait.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if !waitFor(hangWait, cond) {
		tb.Fatalf("timed out waiting for %s", what)
	}
}

// dial opens a WebSocket, failing the test when the upgrade is refused; tb's
// cleanup closes it.
func dial(tb testing.TB, url string, hdr http.Header) *websocket.Conn {
	tb.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(url, hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		tb.Fatalf("dial %s: %v (status %d)", url, err, status)
	}
	tb.Cleanup(func() { ws.Close() })
	return ws
}

// upgradeStatus tries a WebSocket upgrade and returns 101 when it worked
// (closing the connection at once), else the refusal's HTTP status.
func upgradeStatus(tb testing.TB, url string, hdr http.Header) int {
	tb.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(url, hdr)
	if err == nil {
		ws.Close()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		tb.Fatalf("dial %s: %v", url, err)
	}
	return resp.StatusCode
}

// readReply reads text messages until the sentinel and returns the pieces.
func readReply(tb testing.TB, ws *websocket.Conn) []string {
	tb.Helper()
	var pieces []string
	ws.SetReadDeadline(time.Now().Add(hangWait))
	for {
		mt, data, err := ws.ReadMessage()
		if err != nil {
			tb.Fatalf("read: %v (after %d pieces)", err, len(pieces))
		}
		if mt != websocket.TextMessage {
			tb.Fatalf("message type %d, want text", mt)
		}
		if string(data) == web.Sentinel {
			return pieces
		}
		if !utf8.Valid(data) {
			tb.Fatalf("piece %q is not valid UTF-8", data)
		}
		pieces = append(pieces, string(data))
	}
}

// readAnswers reads text-mode answers until the connection ends, handing
// each answer (its pieces, up to the sentinel) to got, and returns the error
// that ended it (a *websocket.CloseError after a close frame). The caller
// sets the read deadline.
func readAnswers(ws *websocket.Conn, got func(pieces []string)) error {
	var cur []string
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		if string(data) == web.Sentinel {
			got(cur)
			cur = nil
			continue
		}
		cur = append(cur, string(data))
	}
}

// closeCode reads until the server closes the connection and returns the
// close frame's code, failing when the connection ends without one.
func closeCode(tb testing.TB, ws *websocket.Conn) int {
	tb.Helper()
	ws.SetReadDeadline(time.Now().Add(hangWait))
	for {
		_, _, err := ws.ReadMessage()
		if err == nil {
			continue
		}
		if ce, ok := err.(*websocket.CloseError); ok {
			return ce.Code
		}
		tb.Fatalf("want a close frame, got %v", err)
	}
}

// readJSON reads one JSON-mode server message.
func readJSON(tb testing.TB, ws *websocket.Conn) jsonmode.Message {
	tb.Helper()
	ws.SetReadDeadline(time.Now().Add(hangWait))
	var m jsonmode.Message
	if err := ws.ReadJSON(&m); err != nil {
		tb.Fatalf("read json: %v", err)
	}
	return m
}

// readUntilDone returns the token messages and the done (or error) message.
func readUntilDone(tb testing.TB, ws *websocket.Conn) ([]jsonmode.Message, jsonmode.Message) {
	tb.Helper()
	var toks []jsonmode.Message
	for {
		m := readJSON(tb, ws)
		switch m.Type {
		case "token":
			toks = append(toks, m)
		case "done", "error":
			return toks, m
		default:
			tb.Fatalf("unexpected message %+v", m)
		}
	}
}
