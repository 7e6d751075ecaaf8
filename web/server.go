// Package web owns the wire: echo routes, the WebSocket upgrade and the
// per-connection reader and writer goroutines, the HTTP streaming endpoints
// and their formats, the embedded chat page, who may connect (origin, host,
// API key) and how much (connection, message and rate caps), and the one
// table that maps error codes to HTTP statuses and close codes. It holds no
// conversation logic: that is session's (history) and chat's (prompts).
package web

import (
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
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
)

// Sentinel is the text-mode end-of-reply message.
const Sentinel = "<<Response Finished>>"

// Sessions is what the WebSocket handler needs from the session layer.
type Sessions interface {
	Open(ctx context.Context, id string) (*session.Session, bool, error)
	Turn(ctx context.Context, id, prompt string, p parley.Params) (*session.Turn, error)
	Reset(ctx context.Context, id string) error
	SetSystem(ctx context.Context, id, text string) error
}

// Config configures a Server.
type Config struct {
	Addr             string        // host:port to listen on
	AllowedOrigins   []string      // extra origins allowed to open WebSockets ("*" = any); same-origin is always allowed
	AllowedHosts     []string      // Host header allow-list (DNS-rebinding guard); empty = any when bound to loopback, else the bind host
	APIKey           string        // when set, required as "Authorization: Bearer KEY" or subprotocol "parley.key.KEY"
	MaxMessageBytes  int64         // per WebSocket message; over it the connection closes with 1009
	MaxConns         int           // open WebSocket connections
	MaxConnsPerIP    int           // open WebSocket connections per client address
	PromptsPerMinute int           // per connection; over it prompts are refused with rate_limited
	DrainTimeout     time.Duration // how long Close lets running replies finish before closing sockets with 1001
	Defaults         parley.Params // sampling defaults
	MaxTokensCap     int           // the largest max_tokens a client may ask for
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
	conns    map[*conn]struct{}
	perIP    map[string]int
	draining atomic.Bool
	connWG   sync.WaitGroup
	ready    atomic.Bool
	mounts   []func(*echo.Echo)
}

// Option configures optional parts of a Server.
type Option func(*Server)

// WithLogger sets the logger.
func WithLogger(l *zap.Logger) Option { return func(s *Server) { s.log = l } }

// WithRoutes lets other parts of the program (HTTP APIs, metrics) add routes.
func WithRoutes(mount func(*echo.Echo)) Option {
	return func(s *Server) { s.mounts = append(s.mounts, mount) }
}

// New builds a Server. Call Open to listen.
func New(cfg Config, sessions Sessions, opts ...Option) *Server {
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
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
	if cfg.Defaults.MaxTokens == 0 {
		cfg.Defaults = parley.DefaultParams()
	}
	s := &Server{
		cfg:      cfg,
		sessions: sessions,
		log:      zap.NewNop(),
		conns:    make(map[*conn]struct{}),
		perIP:    make(map[string]int),
	}
	for _, o := range opts {
		o(s)
	}
	s.upgrader = websocket.Upgrader{
		ReadBufferSize:  4096,
		WriteBufferSize: 4096,
		Subprotocols:    []string{subprotocolJSON},
		CheckOrigin:     s.checkOrigin,
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			writeHTTPError(w, status, statusCode(status), reason.Error())
		},
	}
	s.echo = echo.New()
	s.echo.HideBanner = true
	s.echo.HidePort = true
	s.echo.HTTPErrorHandler = s.httpErrorHandler
	s.routes()
	s.http = &http.Server{
		Handler:           s.echo,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	return s
}

// Handler returns the HTTP handler (for tests that bring their own listener).
func (s *Server) Handler() http.Handler { return s.echo }

// SetReady marks the model as loaded (for /health).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Open listens on cfg.Addr synchronously, so a port error surfaces at once,
// and serves in the background until Close.
func (s *Server) Open() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.ln = ln
	s.connWG.Add(1)
	go func() {
		defer s.connWG.Done()
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", zap.Error(err))
		}
	}()
	return nil
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
// WebSocket with 1001 (going away) and waits for their goroutines.
func (s *Server) Close(ctx context.Context) error {
	s.draining.Store(true)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DrainTimeout)
	defer cancel()
	// Shutdown does not close hijacked (WebSocket) connections; it does stop
	// the listener and wait for plain HTTP requests, including streams.
	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- s.http.Shutdown(ctx) }()

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for s.busyConns() > 0 {
		select {
		case <-ctx.Done():
		case <-tick.C:
			continue
		}
		break
	}
	s.mu.Lock()
	for c := range s.conns {
		c.close(websocket.CloseGoingAway, "server shutting down")
	}
	s.mu.Unlock()
	err := <-shutdownErr
	if err != nil {
		s.http.Close()
	}
	s.connWG.Wait()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func (s *Server) busyConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if c.busy.Load() {
			n++
		}
	}
	return n
}

func (s *Server) routes() {
	e := s.echo
	e.Use(s.guardHost)
	e.GET("/", s.handleRoot)
	e.GET("/ws", s.handleWebSocket)
	sub, _ := fs.Sub(uiFiles, "ui")
	e.GET("/ui/*", echo.WrapHandler(http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))))
	e.GET("/health", s.handleHealth)
	for _, m := range s.mounts {
		m(e)
	}
}

func (s *Server) handleRoot(c echo.Context) error {
	if websocket.IsWebSocketUpgrade(c.Request()) {
		return s.handleWebSocket(c)
	}
	page, err := uiFiles.ReadFile("ui/index.html")
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.HTMLBlob(http.StatusOK, page)
}

func (s *Server) handleHealth(c echo.Context) error {
	if !s.ready.Load() {
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "loading"})
	}
	if s.draining.Load() {
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "draining"})
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// guardHost refuses requests whose Host header is not allowed: a browser on
// a rebinding domain that resolves to our loopback address sends its own
// name as Host, so this is the guard against DNS rebinding.
func (s *Server) guardHost(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !s.hostAllowed(c.Request().Host) {
			return parley.Errorf(parley.EForbidden, "host %q is not allowed", c.Request().Host)
		}
		return next(c)
	}
}

func (s *Server) hostAllowed(host string) bool {
	if len(s.cfg.AllowedHosts) == 0 {
		return true
	}
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	for _, a := range s.cfg.AllowedHosts {
		if a == "*" || strings.EqualFold(a, h) || strings.EqualFold(a, host) {
			return true
		}
	}
	return false
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
	host := origin
	if i := strings.Index(host, "://"); i >= 0 {
		host = host[i+3:]
	}
	return strings.EqualFold(host, r.Host)
}

// authorized checks the API key from the Authorization header or, for
// browsers (which cannot set headers on WebSockets), a subprotocol token.
func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.APIKey == "" {
		return true
	}
	want := []byte(s.cfg.APIKey)
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		if subtle.ConstantTimeCompare([]byte(strings.TrimPrefix(h, "Bearer ")), want) == 1 {
			return true
		}
	}
	for _, p := range websocket.Subprotocols(r) {
		if strings.HasPrefix(p, subprotocolKeyPrefix) &&
			subtle.ConstantTimeCompare([]byte(strings.TrimPrefix(p, subprotocolKeyPrefix)), want) == 1 {
			return true
		}
	}
	return false
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
