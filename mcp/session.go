package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/parley-chat/parley/toolloop"
)

// errClosed is the error of a session that was closed (Parley shuts down,
// or the session was idle).
var errClosed = errors.New("the session is closed")

// sseRetries is how many times in a row an HTTP server's event stream is
// opened again, with GET and Last-Event-ID after the delay the server's
// retry field asks for, when it ends before its last message without
// progress in between: a server may close a call's stream on purpose and
// deliver the result on the resumed one (SEP-1699). Past that the
// connection fails and the supervisor starts the session again.
const sseRetries = 2

// errCallTimeout is the cause of a call's context when its time is up.
var errCallTimeout = errors.New("call timeout")

// session is one connection to one server for one user (or for all users
// of a shared server), kept up by its supervisor goroutine (run): it starts
// the server or connects to it, lists its tools, relists them when the
// server says they changed, and starts it again with backoff when it exits,
// crashes or hangs.
type session struct {
	m     *Manager
	label string
	user  string // "" for a shared server's
	cfg   ServerConfig

	stop chan struct{} // closed to end the session
	done chan struct{} // closed when run has returned

	refresh chan struct{}   // the server's tool list changed (capacity 1)
	restart chan *callTrace // a call hung: start again once its cancellation is sent (capacity 1)

	mu       sync.Mutex
	cs       *sdk.ClientSession // nil while not connected
	lost     chan struct{}      // closed when cs's connection has ended
	tools    []toolloop.RemoteTool
	listed   map[string]bool
	lastErr  error
	starting bool // a start is in progress (not a backoff between starts)
	closed   bool
	changed  chan struct{} // closed and replaced whenever the fields above change
	starts   int           // connections made, the first included
	refreshs int           // tool lists fetched after a change notice
	inUse    int           // calls and listings in progress (the Manager's lock guards it)
	lastUse  time.Time     // the Manager's lock guards it
}

func newSession(m *Manager, label, user string, cfg ServerConfig) *session {
	return &session{
		m: m, label: label, user: user, cfg: cfg,
		stop: make(chan struct{}), done: make(chan struct{}),
		refresh: make(chan struct{}, 1), restart: make(chan *callTrace, 1),
		changed: make(chan struct{}),
	}
}

// notify wakes those waiting for a change; s.mu must be held.
func (s *session) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// run is the session's supervisor goroutine.
func (s *session) run() {
	defer close(s.done)
	backoff := s.m.backoffMin
	for {
		s.mu.Lock()
		s.starting = true
		s.notify()
		s.mu.Unlock()
		up := time.Now()
		err := s.serve()
		s.mu.Lock()
		s.cs, s.starting = nil, false
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.lastErr = err
		s.notify()
		s.mu.Unlock()
		select {
		case <-s.stop:
			s.close()
			return
		default:
		}
		if time.Since(up) > s.m.backoffMax {
			backoff = s.m.backoffMin // it ran a good while: this is no crash loop
		}
		s.m.log.Warn("mcp server session ended; starting it again",
			zap.String("server", s.label), zap.String("user", s.user),
			zap.Duration("backoff", backoff), zap.String("error", s.m.redact(err.Error())))
		select {
		case <-s.stop:
			s.close()
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.m.backoffMax)
	}
}

// close marks the session closed and wakes its waiters.
func (s *session) close() {
	s.mu.Lock()
	s.closed = true
	s.cs = nil
	s.notify()
	s.mu.Unlock()
}

// serve connects once, lists the tools and serves until the connection
// ends; it returns why.
func (s *session) serve() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.m.cfg.StartTimeout))
	// A stop while starting ends the start at once.
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	cs, proc, err := s.connect(ctx)
	if err != nil {
		cancel()
		return err
	}
	end := func() {
		cs.Close()
		if proc != nil {
			proc.kill()
			s.logStderr(proc)
		}
	}
	// endGently is end for a connection that still works: a stdio server
	// gets stopGrace to act on what it read (a call's cancellation) and
	// exit, the client still reading what it writes.
	endGently := func() {
		if proc != nil {
			proc.stop(stopGrace)
		}
		cs.Close()
		if proc != nil {
			s.logStderr(proc)
		}
	}
	if err := s.list(ctx, cs); err != nil {
		cancel()
		end()
		return err
	}
	cancel()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		end()
		return errClosed
	}
	lost := make(chan struct{})
	s.cs, s.lost, s.starting = cs, lost, false
	s.starts++
	s.lastErr = nil
	s.notify()
	s.mu.Unlock()

	waitErr := make(chan error, 1)
	go func() {
		err := cs.Wait()
		close(lost) // calls wait for the next connection from now on
		waitErr <- err
	}()
	for {
		select {
		case <-s.stop:
			s.close()
			end()
			<-waitErr
			return errClosed
		case err := <-waitErr:
			end()
			if proc != nil {
				if e := proc.exitErr(); e != nil {
					return e
				}
			}
			if err == nil {
				err = errors.New("the server closed the connection")
			}
			return fmt.Errorf("connection lost: %w", err)
		case tr := <-s.restart:
			// The SDK sends the hung call's cancellation on its own
			// goroutine: let it reach the server before the connection
			// closes.
			grace := time.NewTimer(cancelGrace)
			select {
			case <-tr.sent:
			case <-lost:
			case <-s.stop:
			case <-grace.C:
			}
			grace.Stop()
			endGently()
			<-waitErr
			return errors.New("a call did not end in time")
		case <-s.refresh:
			lctx, lcancel := context.WithTimeout(context.Background(), time.Duration(s.m.cfg.StartTimeout))
			err := s.list(lctx, cs)
			lcancel()
			if err != nil {
				end()
				<-waitErr
				return fmt.Errorf("list tools after a change: %w", err)
			}
			s.mu.Lock()
			s.refreshs++
			s.notify()
			s.mu.Unlock()
		}
	}
}

// connect starts the server (stdio) or opens its URL (Streamable HTTP) and
// initializes the MCP session.
func (s *session) connect(ctx context.Context) (*sdk.ClientSession, *process, error) {
	client := sdk.NewClient(&sdk.Implementation{Name: "parley", Version: "1"}, &sdk.ClientOptions{
		// No roots, sampling or elicitation: a server gets nothing from Parley but calls.
		Capabilities: &sdk.ClientCapabilities{},
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
			select {
			case s.refresh <- struct{}{}:
			default: // a refresh is pending already
			}
		},
	})
	var (
		t    sdk.Transport
		proc *process
	)
	if s.cfg.Command != "" {
		p, err := startProcess(s.cfg)
		if err != nil {
			return nil, nil, err
		}
		proc = p
		r, w := p.pipes()
		t = tracedTransport{&sdk.IOTransport{Reader: r, Writer: w, MaxLineLength: s.m.cfg.MaxFrameBytes}}
	} else {
		u, _ := url.Parse(s.cfg.URL) // checked when the configuration was read
		t = &sdk.StreamableClientTransport{
			Endpoint:     s.cfg.URL,
			HTTPClient:   httpClient(u, s.cfg.Headers, s.cfg.AllowPrivate, int64(s.m.cfg.MaxFrameBytes)),
			MaxRetries:   sseRetries,
			MaxEventSize: s.m.cfg.MaxFrameBytes,
		}
	}
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		if proc != nil {
			proc.kill()
			if e := proc.exitErr(); e != nil {
				s.logStderr(proc)
				return nil, nil, fmt.Errorf("initialize: %w (%v)", err, e)
			}
		}
		return nil, nil, fmt.Errorf("initialize: %w", err)
	}
	return cs, proc, nil
}

// list fetches the server's tools, up to MaxTools of them.
func (s *session) list(ctx context.Context, cs *sdk.ClientSession) error {
	var tools []toolloop.RemoteTool
	listed := map[string]bool{}
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("list tools: %w", err)
		}
		if t == nil || t.Name == "" || listed[t.Name] {
			continue
		}
		if len(tools) == s.m.cfg.MaxTools {
			s.m.log.Warn("mcp server lists more tools than max_tools; the rest are left out",
				zap.String("server", s.label), zap.Int("max_tools", s.m.cfg.MaxTools))
			break
		}
		schema, err := json.Marshal(t.InputSchema)
		if err != nil || string(schema) == "null" {
			schema = nil
		}
		listed[t.Name] = true
		tools = append(tools, toolloop.RemoteTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	s.mu.Lock()
	s.tools, s.listed = tools, listed
	s.mu.Unlock()
	return nil
}

// logStderr logs the end of a stdio server's stderr, secrets masked.
func (s *session) logStderr(p *process) {
	tail, total := p.stderr.tail()
	if total == 0 {
		return
	}
	s.m.log.Info("mcp server stderr (its last bytes)", zap.String("server", s.label), zap.String("user", s.user),
		zap.Int64("stderr_bytes", total), zap.String("stderr_tail", s.m.redact(tail)))
}

// ready waits until the session is connected (to another connection than
// stale, when given) and returns its client session and tools. It fails
// when ctx ends first, when the session is closed, and at once, with the
// error its last start met, while it waits to start again (a server that is
// down does not hold up the requests that would use it); a caller with a
// stale connection waits for the next one through that wait.
func (s *session) ready(ctx context.Context, stale *sdk.ClientSession) (*sdk.ClientSession, []toolloop.RemoteTool, map[string]bool, error) {
	for {
		s.mu.Lock()
		cs, lost, tools, listed, lastErr, closed, starting, ch := s.cs, s.lost, s.tools, s.listed, s.lastErr, s.closed, s.starting, s.changed
		s.mu.Unlock()
		switch {
		case closed:
			return nil, nil, nil, errClosed
		case cs != nil && cs != stale && !isClosed(lost):
			return cs, tools, listed, nil
		case cs == nil && !starting && lastErr != nil && stale == nil:
			return nil, nil, nil, fmt.Errorf("not available (it is started again shortly): %s", s.m.redact(lastErr.Error()))
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, nil, nil, fmt.Errorf("not available: %s", s.m.redact(lastErr.Error()))
			}
			return nil, nil, nil, fmt.Errorf("not ready in time: %w", context.Cause(ctx))
		}
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// kick asks the supervisor to start the session again (a call hung) if cs
// is still its connection, once the call's cancellation (tr) is sent.
func (s *session) kick(cs *sdk.ClientSession, tr *callTrace) {
	s.mu.Lock()
	current := s.cs == cs
	s.mu.Unlock()
	if !current {
		return
	}
	select {
	case s.restart <- tr:
	default:
	}
}

// call calls tool once the session is ready. The call runs on its own
// goroutine, so that a server that stops reading (a write blocked on a full
// pipe) cannot hold the caller past ctx: when ctx's time is up the session
// is started again, which ends that goroutine, once the SDK has sent the
// call's cancellation to the server (cancel.go).
//
// A call the SDK refused to send because the connection was closing (it
// ended in the moment before) waits for the next connection and is sent
// there: it never reached the server, so it cannot run twice.
func (s *session) call(ctx context.Context, tool string, args map[string]any) (*sdk.CallToolResult, error) {
	var stale *sdk.ClientSession
	for {
		r, cs, err := s.callOnce(ctx, stale, tool, args)
		if cs == nil || !errors.Is(err, sdk.ErrConnectionClosed) || ctx.Err() != nil {
			return r, err
		}
		stale = cs
	}
}

// callOnce is one attempt of call on the first connection other than
// stale; it returns the connection it used.
func (s *session) callOnce(ctx context.Context, stale *sdk.ClientSession, tool string, args map[string]any) (*sdk.CallToolResult, *sdk.ClientSession, error) {
	cs, _, listed, err := s.ready(ctx, stale)
	if err != nil {
		return nil, nil, err
	}
	if !listed[tool] {
		return nil, nil, fmt.Errorf("lists no tool %q", tool)
	}
	type result struct {
		r   *sdk.CallToolResult
		err error
	}
	ch := make(chan result, 1)
	ctx, tr := withTrace(ctx)
	go func() {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
		ch <- result{r, err}
	}()
	select {
	case r := <-ch:
		if errors.Is(r.err, sdk.ErrConnectionClosed) {
			return nil, cs, r.err
		}
		if r.err != nil && ctx.Err() == nil {
			return nil, cs, fmt.Errorf("call %q: %s", tool, s.m.redact(r.err.Error()))
		}
		if r.err == nil {
			return r.r, cs, nil
		}
	case <-ctx.Done():
	}
	if errors.Is(context.Cause(ctx), errCallTimeout) {
		s.kick(cs, tr)
	}
	return nil, cs, context.Cause(ctx)
}

// counts returns how many times the session connected and relisted its
// tools after a change notice.
func (s *session) counts() (starts, refreshes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.refreshs
}
