package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley/toolloop"
)

// Backoff between a server's restarts, doubling from the first to the cap.
const (
	DefaultBackoffMin = 500 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
)

// ErrNotAllowed is the error of a listing or a call the user's policy does
// not allow.
var ErrNotAllowed = errors.New("not available to you")

// ErrTooManySessions is the error of a user's first use of a server when
// max_sessions sessions are open and in use.
var ErrTooManySessions = errors.New("too many MCP server sessions are open")

// Manager runs the operator's MCP servers for Parley's users: it starts a
// session per user and server on first use (one for all users of a shared
// server), keeps it up, closes it when idle, and lists and calls tools
// under each user's policy. It satisfies toolloop.Host. Close stops every
// session and kills every server it started.
type Manager struct {
	cfg     *Config
	log     *zap.Logger
	secrets []string

	backoffMin, backoffMax time.Duration

	mu       sync.Mutex
	sessions map[sessionKey]*session
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup // the reaper and every session's supervisor
}

// sessionKey names a session: a server and a user ("" for a shared server).
type sessionKey struct{ server, user string }

// Option configures a Manager.
type Option func(*Manager)

// WithLogger sets the logger; the default discards.
func WithLogger(l *zap.Logger) Option { return func(m *Manager) { m.log = l } }

// WithBackoff sets the backoff between restarts: min doubling up to max.
func WithBackoff(min, max time.Duration) Option {
	return func(m *Manager) { m.backoffMin, m.backoffMax = min, max }
}

// New returns a Manager for cfg (a zero Config is no servers) and starts
// its shared servers.
func New(cfg *Config, opts ...Option) *Manager {
	c := *cfg
	c.defaults()
	cfg = &c
	m := &Manager{
		cfg: cfg, log: zap.NewNop(), secrets: cfg.secrets(),
		backoffMin: DefaultBackoffMin, backoffMax: DefaultBackoffMax,
		sessions: map[sessionKey]*session{}, stop: make(chan struct{}),
	}
	for _, o := range opts {
		o(m)
	}
	m.wg.Add(1)
	go m.reaper()
	m.mu.Lock()
	for label, sc := range cfg.Servers {
		if sc.Shared {
			m.startLocked(sessionKey{label, ""}, sc)
		}
	}
	m.mu.Unlock()
	return m
}

// Close stops every session, kills the servers Parley started and waits
// for them.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.stop)
	for _, s := range m.sessions {
		close(s.stop)
	}
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

// redact masks the operator's secrets in s.
func (m *Manager) redact(s string) string {
	for _, v := range m.secrets {
		s = strings.ReplaceAll(s, v, "[secret]")
	}
	return s
}

// Servers returns the labels of the servers user may use, sorted.
func (m *Manager) Servers(user string) []string {
	return m.cfg.allowedServers(user)
}

// ListTools returns the tools of server that user may call, starting
// the user's session when it is not running (and waiting for it within
// ctx and the start timeout).
func (m *Manager) ListTools(ctx context.Context, user, server string) ([]toolloop.RemoteTool, error) {
	if !slices.Contains(m.cfg.allowedServers(user), server) {
		return nil, fmt.Errorf("mcp server %q: %w", server, ErrNotAllowed)
	}
	s, release, err := m.acquire(server, user)
	if err != nil {
		return nil, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, time.Duration(m.cfg.StartTimeout))
	defer cancel()
	_, tools, _, err := s.ready(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp server %q: %w", server, err)
	}
	var out []toolloop.RemoteTool
	for _, t := range tools {
		if m.cfg.allowed(user, server, t.Name) {
			out = append(out, t)
		}
	}
	return out, nil
}

// CallTool calls tool on server for user with args (a JSON object),
// within the server's call timeout. The result's text is capped at
// max_result_bytes and has the operator's secrets masked; so has an
// error's. A server that hangs fails the call when its time is up and is
// started again; one that crashes fails the calls in progress.
func (m *Manager) CallTool(ctx context.Context, user, server, tool string, args json.RawMessage) (toolloop.Result, error) {
	if !m.cfg.allowed(user, server, tool) {
		return toolloop.Result{}, fmt.Errorf("tool %q of mcp server %q: %w", tool, server, ErrNotAllowed)
	}
	var a map[string]any
	if len(args) > 0 {
		if err := json.Unmarshal(args, &a); err != nil {
			return toolloop.Result{}, fmt.Errorf("tool %q of mcp server %q: the arguments must be a JSON object", tool, server)
		}
	}
	s, release, err := m.acquire(server, user)
	if err != nil {
		return toolloop.Result{}, err
	}
	defer release()
	timeout := time.Duration(m.cfg.CallTimeout)
	if t := m.cfg.Servers[server].CallTimeout; t > 0 {
		timeout = time.Duration(t)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errCallTimeout)
	defer cancel()
	r, err := s.call(ctx, tool, a)
	if err != nil {
		if errors.Is(err, errCallTimeout) {
			return toolloop.Result{}, fmt.Errorf("mcp server %q did not answer the call to %q within %s", server, tool, timeout)
		}
		return toolloop.Result{}, fmt.Errorf("mcp server %q: %w", server, err)
	}
	return render(r, m.cfg.MaxResultBytes, m.redact), nil
}

// acquire returns the session of server for user, started if need be, and
// marks it in use until release is called.
func (m *Manager) acquire(server, user string) (*session, func(), error) {
	sc, ok := m.cfg.Servers[server]
	if !ok {
		return nil, nil, fmt.Errorf("mcp server %q: %w", server, ErrNotAllowed)
	}
	key := sessionKey{server, user}
	if sc.Shared {
		key.user = ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, fmt.Errorf("mcp server %q: %w", server, errClosed)
	}
	s := m.sessions[key]
	if s == nil {
		if len(m.sessions) >= m.cfg.MaxSessions && !m.evictLocked() {
			return nil, nil, fmt.Errorf("mcp server %q: %w (max_sessions %d)", server, ErrTooManySessions, m.cfg.MaxSessions)
		}
		s = m.startLocked(key, sc)
	}
	s.inUse++
	return s, func() {
		m.mu.Lock()
		s.inUse--
		s.lastUse = time.Now()
		m.mu.Unlock()
	}, nil
}

// startLocked starts the session key; m.mu must be held.
func (m *Manager) startLocked(key sessionKey, sc ServerConfig) *session {
	s := newSession(m, key.server, key.user, sc)
	s.lastUse = time.Now()
	m.sessions[key] = s
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		s.run()
	}()
	return s
}

// evictLocked stops the per-user session unused the longest, if one is
// unused, to make room; m.mu must be held.
func (m *Manager) evictLocked() bool {
	var oldest *session
	var oldestKey sessionKey
	for k, s := range m.sessions {
		if s.inUse == 0 && !m.cfg.Servers[k.server].Shared {
			if oldest == nil || s.lastUse.Before(oldest.lastUse) {
				oldest, oldestKey = s, k
			}
		}
	}
	if oldest == nil {
		return false
	}
	delete(m.sessions, oldestKey)
	close(oldest.stop)
	return true
}

// reaper closes per-user sessions that were unused for the idle timeout.
func (m *Manager) reaper() {
	defer m.wg.Done()
	idle := time.Duration(m.cfg.IdleTimeout)
	tick := time.NewTicker(max(idle/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-tick.C:
			m.reapIdle(now.Add(-idle))
		}
	}
}

// reapIdle closes the per-user sessions unused since before.
func (m *Manager) reapIdle(before time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, s := range m.sessions {
		if m.cfg.Servers[k.server].Shared || s.inUse > 0 || !s.lastUse.Before(before) {
			continue
		}
		delete(m.sessions, k)
		close(s.stop)
		n++
	}
	return n
}

// Status is one session's state, for an operator's page or metrics.
type Status struct {
	Server    string `json:"server"`
	User      string `json:"user"` // "" for a shared server's session
	Connected bool   `json:"connected"`
	Tools     int    `json:"tools"`
	Starts    int    `json:"starts"`    // connections made: more than 1 means restarts
	Refreshes int    `json:"refreshes"` // tool lists fetched after the server said they changed
	LastError string `json:"last_error,omitempty"`
}

// Statuses returns the state of every open session, by server then user.
func (m *Manager) Statuses() []Status {
	m.mu.Lock()
	sessions := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		sessions = append(sessions, s)
	}
	m.mu.Unlock()
	out := make([]Status, 0, len(sessions))
	for _, s := range sessions {
		s.mu.Lock()
		st := Status{Server: s.label, User: s.user, Connected: s.cs != nil, Tools: len(s.tools), Starts: s.starts, Refreshes: s.refreshs}
		if s.lastErr != nil {
			st.LastError = m.redact(s.lastErr.Error())
		}
		s.mu.Unlock()
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int {
		if c := strings.Compare(a.Server, b.Server); c != 0 {
			return c
		}
		return strings.Compare(a.User, b.User)
	})
	return out
}

var _ toolloop.Host = (*Manager)(nil)
