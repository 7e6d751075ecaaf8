package chat

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ardanlabs/jinja"
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
	// maxSandboxStderr is how much of a dead child's stderr is kept for the error, in bytes.
	maxSandboxStderr = 512
)

// SandboxChild reports whether this process was started as a sandbox child.
func SandboxChild(getenv func(string) string) bool { return getenv(SandboxEnv) != "" }

// Sandbox renders Jinja templates in a child process under limits. Safe for concurrent use; Close ends the child.
type Sandbox struct {
	command func() *exec.Cmd
	timeout time.Duration
	memory  int64
	size    int

	idle      chan *sandboxWorker // the workers not rendering; a render takes one and gives it back
	done      chan struct{}       // closed by Close
	closeOnce sync.Once
	started   atomic.Int64 // children started: one per worker, and one more for each that died or was killed
}

// sandboxWorker is one child, started on its first render and again after it died.
type sandboxWorker struct {
	proc *sandboxProc // nil until the first render, and after the child died
}

type sandboxProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *os.File
	dec    *json.Decoder
	stderr *tailBuffer
}

// SandboxOption configures a Sandbox.
type SandboxOption func(*Sandbox)

// WithRenderTimeout sets the most one render may take.
func WithRenderTimeout(d time.Duration) SandboxOption { return func(s *Sandbox) { s.timeout = d } }

// WithSandboxMemory sets the child's data-segment limit in bytes.
func WithSandboxMemory(n int64) SandboxOption { return func(s *Sandbox) { s.memory = n } }

// WithSandboxWorkers sets how many children render at once (at least 1).
func WithSandboxWorkers(n int) SandboxOption { return func(s *Sandbox) { s.size = max(n, 1) } }

// NewSandbox returns a Sandbox whose child is this executable (os.Executable) with SandboxEnv set. The child starts
// on the first render.
func NewSandbox(opts ...SandboxOption) *Sandbox {
	s := &Sandbox{timeout: DefaultRenderTimeout, memory: DefaultSandboxMemory, size: DefaultSandboxWorkers, done: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	s.idle = make(chan *sandboxWorker, s.size)
	for range s.size {
		s.idle <- &sandboxWorker{}
	}
	s.command = func() *exec.Cmd {
		exe, err := os.Executable()
		if err != nil {
			exe = os.Args[0]
		}
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), SandboxEnv+"="+strconv.FormatInt(s.memory, 10))
		// The child must not outlive the server, even one stuck in a render when the server is killed.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd
	}
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
	var w *sandboxWorker
	select {
	case <-s.done:
		return "", errClosedSandbox
	case w = <-s.idle:
	}
	defer func() { s.idle <- w }()
	select {
	case <-s.done: // closed while waiting: the worker goes back for Close to end
		return "", errClosedSandbox
	default:
	}
	deadline := time.Now().Add(s.timeout)
	if w.proc == nil {
		p, err := s.start()
		if err != nil {
			return "", fmt.Errorf("render chat template: start the sandbox: %w", err)
		}
		w.proc = p
	}
	p := w.proc
	var resp sandboxResponse
	err := p.out.SetReadDeadline(deadline)
	if err == nil {
		// The pipe's buffer (64 KiB) is smaller than a request can be: write while the child reads.
		werr := make(chan error, 1)
		go func() { werr <- json.NewEncoder(p.in).Encode(sandboxRequest{Src: src, Vars: vars}) }()
		err = p.dec.Decode(&resp)
		if err == nil {
			err = <-werr
		}
	}
	if err != nil {
		w.kill()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "", fmt.Errorf("%w: a render took longer than %v", ErrTemplateLimit, s.timeout)
		}
		why, _, _ := strings.Cut(p.stderr.String(), "\n") // a dying Go runtime's first line says why
		return "", fmt.Errorf("%w: the renderer died (%v): %s", ErrTemplateLimit, err, why)
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

func (s *Sandbox) start() (*sandboxProc, error) {
	cmd := s.command()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	stderr := &tailBuffer{max: maxSandboxStderr}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close() // the child holds its own copy; EOF on r means it exited
	s.started.Add(1)
	return &sandboxProc{cmd: cmd, in: in, out: r, dec: json.NewDecoder(bufio.NewReader(r)), stderr: stderr}, nil
}

var errClosedSandbox = errors.New("render chat template: the sandbox is closed")

// kill ends the worker's child, if any, and waits for it. The caller holds the worker.
func (w *sandboxWorker) kill() {
	p := w.proc
	if p == nil {
		return
	}
	w.proc = nil
	_ = p.cmd.Process.Kill()
	p.in.Close()
	_ = p.cmd.Wait()
	p.out.Close()
}

// Close ends the children, after the renders in progress (each bounded by the render timeout). Renders after Close
// fail.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		for range s.size {
			w := <-s.idle
			w.kill()
		}
	})
	return nil
}

// tailBuffer keeps the first max bytes written to it (a dying Go runtime's first lines say why).
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(bytes.TrimSpace(b.buf.Bytes()))
}

// ServeSandbox is the child's side: it limits this process (its data segment to SandboxEnv's value, one thread),
// then renders the requests read from r, answering each on w, until r ends. It returns the process's exit status.
func ServeSandbox(getenv func(string) string, r io.Reader, w io.Writer) int {
	if n, err := strconv.ParseInt(getenv(SandboxEnv), 10, 64); err == nil && n > 0 {
		lim := syscall.Rlimit{Cur: uint64(n), Max: uint64(n)}
		if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &lim); err != nil {
			fmt.Fprintln(os.Stderr, "template sandbox: limit memory:", err)
			return 1
		}
		debug.SetMemoryLimit(n / 2) // collect hard before the hard limit
	}
	runtime.GOMAXPROCS(1)
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
