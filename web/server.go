// Package web owns the wire: the server (listening, draining, who may
// connect and how much), the one route table (routes.go) and the error
// body each route answers with (errors.go), admin (admin.go), /health,
// /info and /metrics, and the embedded chat page. The protocols live
// beneath it, one package per API family, none of which imports another
// or web (layers_test.go holds it):
//
//	chatsocket   the chat WebSocket: sessions, resumable replies, text and JSON modes
//	openai       OpenAI's chat completions, completions and model list
//	responses    OpenAI's Responses and Conversations APIs, with their WebSocket mode
//	anthropic    Anthropic's Messages API
//	ollama       Ollama's API
//	tgi          TGI, SageMaker, DJL's JSON lines and plain text
//
// What the families share sits under internal: apicore (decode and
// validate a request once, pick the model, start a chat or completion,
// relay or collect the reply, the stream writer, the status table, the
// tools several families take), wsock (the socket lifecycle: the pump and
// the server's side of a socket), oaiwire (OpenAI's error object) and
// servertools (a reply that runs the operator's MCP tools through the tool
// loop, for the families that offer them). A
// family gets the server only through apicore.Core and wsock.Lifecycle.
// The package holds no conversation logic: that is session's (history)
// and chat's (prompts).
package web

import (
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/chatsocket"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/wsock"
	"github.com/parley-chat/parley/web/responses"
)

//go:embed ui
var uiFiles embed.FS

// Defaults for Config's zero values.
const (
	DefaultMaxMessageBytes  = 64 << 10 // bytes per WebSocket message
	DefaultMaxConns         = 1024     // open WebSocket connections, all clients
	DefaultMaxConnsPerIP    = 64       // open WebSocket connections per client address
	DefaultPromptsPerMinute = 60       // prompts per connection per minute
	DefaultDrainTimeout     = 30 * time.Second
	DefaultPongWait         = 60 * time.Second // silence (not even a pong) after which a peer is dropped
	DefaultWriteWait        = 10 * time.Second // bound on every write to a client
	DefaultSendBuffer       = 1024             // frames queued per connection for its writer
	DefaultMaxQueuedPrompts = 16               // prompts and control messages waiting per connection
	DefaultMaxPromptTokens  = 8192             // tokens per prompt
	DefaultBodyTimeout      = 30 * time.Second // to receive a request body
	DefaultMaxHTTPConns     = 2048             // open TCP connections, WebSockets included: above DefaultMaxConns, so /health and the APIs answer while WebSockets are at their cap
)

// Sentinel is the text-mode end-of-reply message.
const Sentinel = chatsocket.Sentinel

// Sessions is what the WebSocket chat needs from the session layer.
type Sessions = chatsocket.Sessions

// subprotocolKeyPrefix carries the API key as a WebSocket subprotocol
// ("parley.key.KEY"): browsers cannot set headers on a WebSocket.
const subprotocolKeyPrefix = "parley.key."

// Config configures a Server.
type Config struct {
	Addr           string   // host:port to listen on
	AllowedOrigins []string // extra origins allowed to open WebSockets ("*" = any); same-origin is always allowed
	AllowedHosts   []string // Host header allow-list (DNS-rebinding guard); empty = IP addresses, localhost names and Addr's host; "*" = any
	APIKey         string   // when set, required as "Authorization: Bearer KEY", "x-api-key: KEY" or subprotocol "parley.key.KEY"
	// Users maps API keys to named users (see UserKey): any of them is
	// accepted the way APIKey is, and the request acts as the key's user,
	// who reaches only its own sessions. APIKey, when set beside them, is
	// the anonymous user's key.
	Users []UserKey
	// CachePerClient gives every client address of a user a cache scope of
	// its own (parley.ClientCacheScope) instead of one per user: without
	// named users, clients that share the one key (or no key) then share
	// no KV cache either.
	CachePerClient   bool
	MaxMessageBytes  int64         // per WebSocket message; over it the connection closes with 1009
	MaxConns         int           // open WebSocket connections
	MaxConnsPerIP    int           // open WebSocket connections per client address
	PromptsPerMinute int           // per connection; over it prompts are refused with rate_limited
	DrainTimeout     time.Duration // how long Close lets running replies finish before closing sockets with 1001
	Defaults         parley.Params // sampling defaults
	MaxTokensCap     int           // the largest max_tokens a client may ask for
	// MaxPromptTokens caps the tokens of one prompt: a stateless request's
	// whole prompt (a Responses request that starts a conversation's
	// included); a chat socket's message or a Responses turn's new input
	// (its items, tools and instructions) on its own, BOS included. Over it
	// the prompt is refused with too_large. It needs WithTokenizer; without
	// one nothing is counted. < 0 means no cap.
	MaxPromptTokens int
	// MaxQueuedPrompts bounds the prompts and control messages waiting on
	// one connection behind the reply that is streaming; past it prompts
	// are refused with busy.
	MaxQueuedPrompts int
	// PongWait is how long a connection may stay silent (no message, no
	// pong) before the peer is dropped; pings go out every half of it.
	PongWait time.Duration
	// WriteWait bounds every write. A client that does not take a frame
	// within it is dropped, and its reply cancelled.
	WriteWait time.Duration
	// SendBuffer is how many frames may wait for a connection's writer. A
	// client that lets them pile up is too slow: it is closed with 1008
	// and its reply cancelled, so memory stays bounded whatever it does.
	SendBuffer int
	// BodyTimeout bounds the time to receive a request body, so a body that
	// never ends (chunked) or falls short of its Content-Length cannot hold
	// a connection.
	BodyTimeout time.Duration
	// MaxHTTPConns bounds open TCP connections of every kind (MaxConns
	// covers only WebSockets). Past it a new connection gets a 503 and is
	// closed.
	MaxHTTPConns int
	// MaxHTTPConnsPerIP bounds the open TCP connections of one client
	// address, WebSockets included; past it a new connection gets a 429
	// with Retry-After and is closed.
	MaxHTTPConnsPerIP int
	// MaxBodyBytesInflight bounds the bytes of the request bodies of all
	// requests being handled at once (bodybudget.go); one client address
	// may hold a quarter of it. Past it requests are refused before their
	// body is read: 503 (429 for one address's quarter), with Retry-After.
	MaxBodyBytesInflight int64
	// ResumeGrace is how long a chat reply goes on after its socket drops,
	// its tokens kept for a client that resumes the session (chatsocket/resume.go).
	// 0 cancels it at once.
	ResumeGrace time.Duration
	// ResumeBuffer bounds the tokens a reply may generate while no client
	// follows it; past it the reply is cancelled (DefaultResumeBuffer when 0).
	ResumeBuffer int
}

// Server serves the chat page, the WebSocket chat and the HTTP endpoints.
type Server struct {
	cfg      Config
	sessions Sessions
	log      *zap.Logger
	echo     *echo.Echo
	http     *http.Server
	ln       net.Listener
	upgrader websocket.Upgrader

	mu       sync.Mutex
	conns    map[wsock.Socket]struct{}
	perIP    map[string]int
	admitted int // connections past admit and not yet released; guarded by mu (the global cap counts these, so handshakes in flight count too)
	draining atomic.Bool
	// stop is the parent of every request's and socket's context; Close
	// cancels it (stopAll) when the drain deadline passes, so whatever is
	// still running is cancelled rather than waited for.
	stop    context.Context
	stopAll context.CancelCauseFunc
	connWG  sync.WaitGroup // the serve loop and every tracked socket
	reqWG   sync.WaitGroup // HTTP handlers running (see trackRequest)
	ready   atomic.Bool
	mounts  []func(*echo.Echo)
	op      *ops             // metrics, /info and readiness (metrics.go, info.go)
	core    *apicore.Core    // what every API family runs on (routes.go)
	bodies  *bodyBudget      // the bytes request bodies hold (bodybudget.go)
	chat    *chatsocket.Chat // the chat WebSocket (routes.go)
	resp    *responses.API   // the Responses API, when the sessions serve it (routes.go); nil: not mounted
	models  Models           // several models (admin.go); nil: one
	embeds  EmbedModels      // embeddings and rerank (embeddings.go); nil: not mounted
}

// Option configures optional parts of a Server.
type Option func(*Server)

// WithLogger sets the logger.
func WithLogger(l *zap.Logger) Option { return func(s *Server) { s.log = l } }

// WithTokenizer lets the server count prompt tokens for Config.MaxPromptTokens.
func WithTokenizer(t Tokenizer) Option { return func(s *Server) { s.core.Tokenizer = t } }

// WithRoutes lets other parts of the program (HTTP APIs, metrics) add routes.
func WithRoutes(mount func(*echo.Echo)) Option {
	return func(s *Server) { s.mounts = append(s.mounts, mount) }
}

// New builds a Server. Call Open to listen.
func New(cfg Config, sessions Sessions, opts ...Option) *Server {
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.MaxHTTPConns <= 0 {
		cfg.MaxHTTPConns = DefaultMaxHTTPConns
	}
	if cfg.MaxHTTPConnsPerIP <= 0 {
		cfg.MaxHTTPConnsPerIP = DefaultMaxHTTPConnsPerIP
	}
	if cfg.MaxBodyBytesInflight <= 0 {
		cfg.MaxBodyBytesInflight = DefaultMaxBodyBytesInflight
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerIP <= 0 {
		cfg.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if cfg.PromptsPerMinute <= 0 {
		cfg.PromptsPerMinute = DefaultPromptsPerMinute
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.MaxPromptTokens == 0 {
		cfg.MaxPromptTokens = DefaultMaxPromptTokens
	}
	if cfg.MaxQueuedPrompts <= 0 {
		cfg.MaxQueuedPrompts = DefaultMaxQueuedPrompts
	}
	if cfg.PongWait <= 0 {
		cfg.PongWait = DefaultPongWait
	}
	if cfg.WriteWait <= 0 {
		cfg.WriteWait = DefaultWriteWait
	}
	if cfg.SendBuffer <= 0 {
		cfg.SendBuffer = DefaultSendBuffer
	}
	if cfg.ResumeBuffer <= 0 {
		cfg.ResumeBuffer = chatsocket.DefaultResumeBuffer
	}
	if cfg.Defaults.MaxTokens == 0 {
		cfg.Defaults = parley.DefaultParams()
	}
	s := &Server{
		cfg:      cfg,
		sessions: sessions,
		log:      zap.NewNop(),
		conns:    make(map[wsock.Socket]struct{}),
		perIP:    make(map[string]int),
		bodies:   newBodyBudget(cfg.MaxBodyBytesInflight),
		core:     &apicore.Core{},
	}
	for _, o := range opts {
		o(s)
	}
	s.initCore()
	s.upgrader = websocket.Upgrader{
		// Memory per idle connection: the read side reuses the 4 KiB
		// buffer net/http already gave the connection, and the write
		// buffer is taken from a pool only while a message is written
		// (replies are many small frames, so 4 KiB covers most).
		ReadBufferSize:  0,
		WriteBufferSize: 4096,
		WriteBufferPool: &sync.Pool{},
		Subprotocols:    []string{chatsocket.SubprotocolJSON},
		CheckOrigin:     s.checkOrigin,
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			writeHTTPError(w, r, status, reason.Error())
		},
	}
	s.echo = echo.New()
	s.echo.HideBanner = true
	s.echo.HidePort = true
	s.echo.HTTPErrorHandler = s.httpErrorHandler
	s.stop, s.stopAll = context.WithCancelCause(context.Background())
	s.initOps()
	s.initChat()
	s.routes()
	s.http = &http.Server{
		Handler:           s.echo,
		BaseContext:       func(net.Listener) context.Context { return s.stop },
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	return s
}

// Handler returns the HTTP handler (for tests that bring their own listener).
func (s *Server) Handler() http.Handler { return s.echo }

// SetReady marks the model as loaded: /health and /ready answer 200 and the
// chat and API routes open (see requireReady). Everything the routes use
// must be in place before SetReady(true).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Open listens on cfg.Addr synchronously, so a port error surfaces at once,
// and serves in the background until Close.
func (s *Server) Open() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.OpenListener(ln)
	return nil
}

// OpenListener is Open on a listener the caller made (socket activation,
// tests that tune their sockets). The server owns ln from here: Close
// closes it. Call it at most once, instead of Open.
func (s *Server) OpenListener(ln net.Listener) {
	s.ln = ln
	ln = newLimitListener(ln, s.cfg.MaxHTTPConns, s.cfg.MaxHTTPConnsPerIP, s.log, s.refused)
	s.connWG.Add(1)
	go func() {
		defer s.connWG.Done()
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", zap.Error(err))
		}
	}()
}

// Addr is the address the server listens on (with the real port when cfg.Addr had port 0).
func (s *Server) Addr() string {
	if s.ln == nil {
		return s.cfg.Addr
	}
	return s.ln.Addr().String()
}

// URL is the server's base http URL.
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close drains: it stops accepting connections and prompts, lets running
// replies finish until ctx or the drain timeout ends, then closes every
// WebSocket with 1001 (going away) and cancels whatever is still running.
// A cancelled turn stores what it delivered (see chat's abandonAfter, which
// bounds the wait for a step stuck in llama.cpp); Close waits for that at
// most stopGrace more, or until ctx ends, so it returns by then even if
// something never does (the error says what was left running).
func (s *Server) Close(ctx context.Context) error {
	s.draining.Store(true)
	drainCtx, cancel := context.WithTimeout(ctx, s.cfg.DrainTimeout)
	defer cancel()
	// Shutdown does not close hijacked (WebSocket) connections; it does stop
	// the listener and wait for plain HTTP requests, including streams.
	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- s.http.Shutdown(drainCtx) }()

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for s.busyConns() > 0 {
		select {
		case <-drainCtx.Done():
		case <-tick.C:
			continue
		}
		break
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close(websocket.CloseGoingAway, "server shutting down")
	}
	s.mu.Unlock()
	err := <-shutdownErr
	// The drain is over: cancel every request and turn still running,
	// saying why (a turn whose prompt never ran is then stored as pending,
	// see session's settle).
	s.stopAll(parley.ErrShuttingDown)
	if err != nil {
		s.http.Close()
	}
	graceCtx, cancelGrace := context.WithTimeout(ctx, stopGrace)
	defer cancelGrace()
	if werr := waitGroup(graceCtx, s.connWG.Wait, s.reqWG.Wait, s.chat.Wait, s.waitResponses); werr != nil {
		return fmt.Errorf("shutdown: %d sockets still open %v after the drain: %w", s.OpenConns(), stopGrace, werr)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// stopGrace is how long Close waits, after cancelling what outlived the
// drain, for handlers to store their turns and return. A cancelled reply
// ends within chat's abandonAfter (1 s) even when its engine step does not.
const stopGrace = 3 * time.Second

// waitResponses waits for the Responses API's background responses.
func (s *Server) waitResponses() {
	if s.resp != nil {
		s.resp.Wait()
	}
}

// waitGroup runs every wait in turn until ctx ends.
func waitGroup(ctx context.Context, waits ...func()) error {
	done := make(chan struct{})
	go func() {
		for _, w := range waits {
			w()
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// trackRequest counts running HTTP handlers, so that Close can wait (a
// bounded time) for cancelled streams to store their turns. WebSocket
// handlers are tracked as sockets instead.
func (s *Server) trackRequest(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if websocket.IsWebSocketUpgrade(c.Request()) {
			return next(c)
		}
		s.reqWG.Add(1)
		defer s.reqWG.Done()
		return next(c)
	}
}

func (s *Server) busyConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.chat.Running() // replies without a socket or a request drain too
	if s.resp != nil {
		n += s.resp.Running()
	}
	for c := range s.conns {
		if c.Replying() {
			n++
		}
	}
	return n
}

// guardHost refuses requests whose Host header is not allowed: a browser on
// a rebinding domain that resolves to our loopback address sends its own
// name as Host, so this is the guard against DNS rebinding.
func (s *Server) guardHost(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !s.hostAllowed(c.Request().Host) && !isProbe(c) {
			return parley.Errorf(parley.EForbidden, "host %q is not allowed", c.Request().Host)
		}
		return next(c)
	}
}

// hostAllowed applies the Host allow-list. With no list, a Host that is an
// IP address or a localhost name is allowed, and so is the host of Config.Addr: a rebinding page can have
// neither as its origin (it needs a name whose DNS the attacker controls),
// while every other name (the attacker's) is refused, on loopback and
// beyond. A list replaces that default ("*" allows any Host).
func (s *Server) hostAllowed(host string) bool {
	if host == "" {
		return true // HTTP/1.0 without Host: not a browser
	}
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), ".")
	if len(s.cfg.AllowedHosts) == 0 {
		if net.ParseIP(h) != nil || strings.EqualFold(h, "localhost") || hasSuffixFold(h, ".localhost") {
			return true
		}
		bind, _, err := net.SplitHostPort(s.cfg.Addr)
		return err == nil && bind != "" && strings.EqualFold(bind, h)
	}
	for _, a := range s.cfg.AllowedHosts {
		if a == "*" || strings.EqualFold(a, h) || strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}

func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// checkOrigin allows same-origin upgrades, clients that send no Origin
// (non-browser clients), and the configured allow-list.
func (s *Server) checkOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	for _, a := range s.cfg.AllowedOrigins {
		if a == "*" || strings.EqualFold(strings.TrimRight(a, "/"), origin) {
			return true
		}
	}
	// Same origin: the scheme and the host both match the request's. The
	// scheme is https when the connection is TLS or a proxy in front says
	// so (X-Forwarded-Proto: a browser cannot set it on a WebSocket).
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") {
		return false
	}
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	if !strings.EqualFold(u.Scheme, scheme) {
		return false
	}
	return strings.EqualFold(stripDefaultPort(u.Host, scheme), stripDefaultPort(r.Host, scheme))
}

// stripDefaultPort drops :80 (http) or :443 (https) from host, so that
// "http://example.com" matches Host "example.com:80".
func stripDefaultPort(host, scheme string) string {
	if scheme == "http" {
		return strings.TrimSuffix(host, ":80")
	}
	return strings.TrimSuffix(host, ":443")
}

// UserKey is one named user's API key (Config.Users).
type UserKey struct {
	User string // the name sessions record; not a secret (it is logged)
	Key  string // the secret; never logged
}

// authorized reports whether r carries an accepted API key (any request
// does when no key is configured).
func (s *Server) authorized(r *http.Request) bool {
	_, ok := s.identify(r)
	return ok
}

// identify finds the user whose API key r carries: in the Authorization
// header (or x-api-key, as Anthropic's clients send it) or, for browsers
// (which cannot set headers on WebSockets), a subprotocol token. With no
// key configured every request is the anonymous user (""). Every presented
// key is compared with every configured one in constant time, whichever
// matches, so the time taken tells nothing about any key.
func (s *Server) identify(r *http.Request) (user string, ok bool) {
	if s.cfg.APIKey == "" && len(s.cfg.Users) == 0 {
		return "", true
	}
	var presented [][]byte
	// The scheme name is case-insensitive (RFC 9110 section 11.1).
	if h := r.Header.Get("Authorization"); len(h) > len("Bearer ") && strings.EqualFold(h[:len("Bearer ")], "Bearer ") {
		presented = append(presented, []byte(strings.TrimSpace(h[len("Bearer "):])))
	}
	// Anthropic's SDKs send the key as x-api-key.
	if h := r.Header.Get("X-Api-Key"); h != "" {
		presented = append(presented, []byte(strings.TrimSpace(h)))
	}
	for _, p := range websocket.Subprotocols(r) {
		if strings.HasPrefix(p, subprotocolKeyPrefix) {
			presented = append(presented, []byte(strings.TrimPrefix(p, subprotocolKeyPrefix)))
		}
	}
	match := func(p []byte, key string) bool {
		return key != "" && subtle.ConstantTimeCompare(p, []byte(key)) == 1
	}
	for _, p := range presented {
		if match(p, s.cfg.APIKey) {
			user, ok = "", true
		}
		for _, u := range s.cfg.Users {
			if match(p, u.Key) {
				user, ok = u.User, true
			}
		}
	}
	return user, ok
}

// RequireKey is echo middleware enforcing the API key on HTTP endpoints.
func (s *Server) RequireKey(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !s.authorized(c.Request()) {
			return parley.Errorf(parley.EUnauthorized, "missing or wrong API key")
		}
		return next(c)
	}
}

// Defaults returns the server's sampling defaults and reply cap.
func (s *Server) Defaults() (parley.Params, int) { return s.cfg.Defaults, s.cfg.MaxTokensCap }

// Draining reports whether Close has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// Logger returns the server's logger.
func (s *Server) Logger() *zap.Logger { return s.log }
