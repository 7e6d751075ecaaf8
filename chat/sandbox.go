package chat

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/parley-chat/parley/internal/sandbox"
)

// A GGUF's chat template is untrusted code: a Jinja template can loop, recurse or allocate without bound, and a Go
// goroutine cannot be stopped from outside. So a Sandbox renders templates in a child process (this same executable,
// started with SandboxEnv set) that limits its own data segment (RLIMIT_DATA, which bounds the Go heap; RLIMIT_AS
// would count the runtime's address-space reservations) and runs on one thread, and the parent kills it when a render takes longer than its time limit. A killed or crashed child is restarted on the next render;
// the render that killed it fails with ErrTemplateLimit. A few children render at once (DefaultSandboxWorkers), so a
// template that is slow on one conversation holds up at most one of them; a real template renders a 200-message
// conversation in about a millisecond.

// SandboxEnv is the environment variable that makes a process a sandbox child: its main (or TestMain) must call
// ServeSandbox first thing when SandboxChild reports it.
const SandboxEnv = "PARLEY_TEMPLATE_SANDBOX"

// Sandbox defaults.
const (
	// DefaultRenderTimeout is the most one render may take, start of the child included.
	DefaultRenderTimeout = 2 * time.Second
	// DefaultSandboxMemory is the child's data-segment limit (RLIMIT_DATA), in bytes. A Go process starts with about
	// 40 MiB of it; a real template needs a few MiB more.
	DefaultSandboxMemory = 1 << 30
	// DefaultSandboxWorkers is how many children render at once.
	DefaultSandboxWorkers = 2
)

// SandboxChild reports whether this process was started as a sandbox child.
func SandboxChild(getenv func(string) string) bool { return getenv(SandboxEnv) != "" }

// Sandbox renders Jinja templates in a child process under limits. Safe for concurrent use; Close ends the child.
type Sandbox struct {
	cfg  sandbox.Config
	pool *sandbox.Pool
}

// SandboxOption configures a Sandbox.
type SandboxOption func(*Sandbox)

// WithRenderTimeout sets the most one render may take.
func WithRenderTimeout(d time.Duration) SandboxOption { return func(s *Sandbox) { s.cfg.Timeout = d } }

// WithSandboxMemory sets the child's data-segment limit in bytes.
func WithSandboxMemory(n int64) SandboxOption { return func(s *Sandbox) { s.cfg.Memory = n } }

// WithSandboxWorkers sets how many children render at once (at least 1).
func WithSandboxWorkers(n int) SandboxOption { return func(s *Sandbox) { s.cfg.Workers = max(n, 1) } }

// NewSandbox returns a Sandbox whose child is this executable (os.Executable) with SandboxEnv set. The child starts
// on the first render.
func NewSandbox(opts ...SandboxOption) *Sandbox {
	s := &Sandbox{cfg: sandbox.Config{Env: SandboxEnv, Timeout: DefaultRenderTimeout, Memory: DefaultSandboxMemory,
		Workers: DefaultSandboxWorkers}}
	for _, o := range opts {
		o(s)
	}
	s.pool = sandbox.New(s.cfg)
	return s
}

type sandboxRequest struct {
	Src  string          `json:"src"`
	Vars json.RawMessage `json:"vars"`
}

type sandboxResponse struct {
	Out   string `json:"out"`
	Err   string `json:"err,omitempty"`
	Limit bool   `json:"limit,omitempty"` // Err is a limit's (ErrTemplateLimit)
}

// RenderJinja implements JinjaRenderer.
func (s *Sandbox) RenderJinja(src string, vars []byte) (string, error) {
	if len(src) > MaxTemplateBytes {
		return "", fmt.Errorf("%w: the template is %d bytes, more than %d", ErrTemplateLimit, len(src), MaxTemplateBytes)
	}
	var resp sandboxResponse
	err := s.pool.Exchange(context.Background(),
		func(w io.Writer) error { return json.NewEncoder(w).Encode(sandboxRequest{Src: src, Vars: vars}) },
		// One response is on its way per request, so a decoder per response loses nothing it read ahead.
		func(r *bufio.Reader) error { return json.NewDecoder(r).Decode(&resp) })
	var start *sandbox.StartError
	var died *sandbox.ChildError
	switch {
	case errors.Is(err, sandbox.ErrClosed):
		return "", errClosedSandbox
	case errors.As(err, &start):
		return "", fmt.Errorf("render chat template: start the sandbox: %w", start.Err)
	case errors.Is(err, sandbox.ErrTimeout):
		return "", fmt.Errorf("%w: a render took longer than %v", ErrTemplateLimit, s.cfg.Timeout)
	case errors.As(err, &died):
		return "", fmt.Errorf("%w: the renderer died (%v): %s", ErrTemplateLimit, died.Err, died.Stderr)
	case err != nil:
		return "", fmt.Errorf("render chat template: %w", err)
	}
	if resp.Err != "" {
		if resp.Limit {
			// The child's message already says which limit; it is rebuilt here around the sentinel.
			msg := strings.Replace(resp.Err, ErrTemplateLimit.Error()+": ", "", 1)
			return "", fmt.Errorf("%w: %s", ErrTemplateLimit, msg)
		}
		return "", errors.New(resp.Err)
	}
	return resp.Out, nil
}

var errClosedSandbox = errors.New("render chat template: the sandbox is closed")

// Close ends the children, after the renders in progress (each bounded by the render timeout). Renders after Close
// fail.
func (s *Sandbox) Close() error { return s.pool.Close() }

// ServeSandbox is the child's side: it limits this process (its data segment to SandboxEnv's value, one thread),
// then renders the requests read from r, answering each on w, until r ends. It returns the process's exit status.
func ServeSandbox(getenv func(string) string, r io.Reader, w io.Writer) int {
	if err := sandbox.Confine(getenv(SandboxEnv)); err != nil {
		fmt.Fprintln(os.Stderr, "template sandbox:", err)
		return 1
	}
	dec := json.NewDecoder(bufio.NewReader(r))
	enc := json.NewEncoder(w)
	var (
		lastKey [32]byte
		last    *jinja.Template
	)
	for {
		var req sandboxRequest
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintln(os.Stderr, "template sandbox: read request:", err)
			return 1
		}
		var resp sandboxResponse
		key := sha256.Sum256([]byte(req.Src))
		var err error
		if last == nil || key != lastKey {
			last, err = compileSafe(req.Src)
			lastKey = key
		}
		if err == nil {
			resp.Out, err = renderCompiled(last, req.Vars)
		}
		if err != nil {
			resp.Err, resp.Limit = err.Error(), errors.Is(err, ErrTemplateLimit)
		}
		if err := enc.Encode(resp); err != nil {
			return 1
		}
	}
}
