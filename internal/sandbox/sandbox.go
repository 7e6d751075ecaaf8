// Package sandbox runs work on hostile input in child processes under limits. A Pool keeps a few children, each
// this same executable started again with an environment variable that makes it a child; a child confines itself
// (Confine: a memory limit, one thread) before it reads its first request, and the parent kills it when an exchange
// takes longer than the time limit. A killed or dead child is started again on the next exchange. What the parent
// and a child say to each other on the child's stdin and stdout is the caller's protocol: this package starts,
// times, bounds and ends the children around it. It uses only the standard library.
package sandbox

import (
	"bufio"
	"context"
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
)

const (
	// maxStderr is how much of a child's stderr is kept, in bytes: a dying Go runtime's first line says why, and a
	// child that writes without end must not grow the parent.
	maxStderr = 512
	// readBuffer is the size of the buffer on a child's stdout, in bytes (a pipe holds 64 KiB).
	readBuffer = 1 << 16
)

// Config says what a Pool's children are and what bounds them.
type Config struct {
	// Env is the environment variable that makes a process a child. The Pool sets it to Memory, which the child
	// hands to Confine.
	Env string
	// Memory is a child's data-segment limit (RLIMIT_DATA), in bytes; 0 sets none.
	Memory int64
	// Timeout is the most one exchange may take, start of the child included.
	Timeout time.Duration
	// Workers is how many children run at once (at least 1).
	Workers int
	// Command makes the command that starts a child; nil: this executable (os.Executable). The Pool adds Env to
	// the command's environment (the process's own when it has none) and asks that the child die with its parent.
	Command func() *exec.Cmd
}

// ErrClosed is returned by an exchange on a closed Pool.
var ErrClosed = errors.New("sandbox: closed")

// ErrTimeout is returned when an exchange took longer than the time limit: its child was killed.
var ErrTimeout = errors.New("sandbox: the time limit passed")

// StartError says that no child could run the exchange: it did not start, or its pipe takes no deadline.
type StartError struct{ Err error }

func (e *StartError) Error() string { return "sandbox: start a child: " + e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// The ops of a ChildError.
const (
	OpReceive = "receive" // the answer did not read
	OpSend    = "send"    // the answer read, but the request's write failed
)

// ChildError says that a child failed an exchange (it died, or what it sent did not read) and was killed.
type ChildError struct {
	// Op is OpReceive or OpSend.
	Op string
	// Err is the read's or the write's error.
	Err error
	// Stderr is the first line the child wrote on its stderr ("" for none): a dying Go runtime's says why.
	Stderr string
}

func (e *ChildError) Error() string {
	if e.Stderr == "" {
		return fmt.Sprintf("sandbox: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("sandbox: %s: %v: %s", e.Op, e.Err, e.Stderr)
}
func (e *ChildError) Unwrap() error { return e.Err }

// Pool runs exchanges on Config.Workers children. Safe for concurrent use; Close ends the children.
type Pool struct {
	cfg Config

	idle      chan *worker  // the workers not in an exchange; an exchange takes one and gives it back
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	started   atomic.Int64 // children started: one per worker, and one more for each that died or was killed
}

// worker is one child, started on its first exchange and again after it died.
type worker struct {
	proc *child // nil until the first exchange, and after the child died
}

type child struct {
	cmd    *exec.Cmd
	in     io.WriteCloser // the child's stdin
	out    *os.File       // the child's stdout, which takes a read deadline
	rd     *bufio.Reader
	stderr *headBuffer
}

// New returns a Pool whose children start on their first exchange.
func New(cfg Config) *Pool {
	cfg.Workers = max(cfg.Workers, 1)
	p := &Pool{cfg: cfg, idle: make(chan *worker, cfg.Workers), done: make(chan struct{})}
	for range cfg.Workers {
		p.idle <- &worker{}
	}
	return p
}

// Started is how many children p has started: one per worker used, and one more for each that died or was killed.
func (p *Pool) Started() int64 { return p.started.Load() }

// Exchange runs one request on an idle child (waiting for one), starting it first when it is not running: send
// writes the request to the child's stdin while receive reads the answer from its stdout, so that a request larger
// than the pipe's buffer does not block. The exchange ends by the time limit: past it, receive's read fails and
// the child is killed (ErrTimeout). A child that fails an exchange is killed (*ChildError), so that the next one
// starts a fresh child in step with the protocol; a child that could not start is a *StartError. A ctx that ends
// first returns ctx's error, and the child in the exchange is killed.
func (p *Pool) Exchange(ctx context.Context, send func(w io.Writer) error, receive func(r *bufio.Reader) error) error {
	var w *worker
	select {
	case <-p.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	case w = <-p.idle:
	}
	defer func() { p.idle <- w }()
	select {
	case <-p.done: // closed while waiting: the worker goes back for Close to end
		return ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil { // ended while waiting: no child is started or spent for it
		return err
	}
	deadline := time.Now().Add(p.cfg.Timeout)
	if w.proc == nil {
		c, err := p.start()
		if err != nil {
			return &StartError{Err: err}
		}
		w.proc = c
	}
	c := w.proc
	if err := c.out.SetReadDeadline(deadline); err != nil {
		w.kill()
		return &StartError{Err: err}
	}
	// A ctx that ends makes the pending read fail at once; the child is then killed below. The worker goes back only
	// after that func has run or been stopped, so that it never moves the deadline of the worker's next exchange.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.out.SetReadDeadline(time.Now())
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	werr := make(chan error, 1)
	go func() { werr <- send(c.in) }()
	if err := receive(c.rd); err != nil {
		w.kill() // ends the writer too: its pipe closes
		<-werr
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return ErrTimeout
		}
		return &ChildError{Op: OpReceive, Err: err, Stderr: c.stderr.firstLine()}
	}
	// The answer is read, so the child has read the whole request and the write has ended; one that failed leaves
	// the child out of step with this side, and it is ended.
	if err := <-werr; err != nil {
		w.kill()
		return &ChildError{Op: OpSend, Err: err, Stderr: c.stderr.firstLine()}
	}
	return nil
}

func (p *Pool) command() *exec.Cmd {
	var cmd *exec.Cmd
	if p.cfg.Command != nil {
		cmd = p.cfg.Command()
	} else {
		exe, err := os.Executable()
		if err != nil {
			exe = os.Args[0]
		}
		cmd = exec.Command(exe)
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, p.cfg.Env+"="+strconv.FormatInt(p.cfg.Memory, 10))
	// The child must not outlive the parent, even one stuck in an exchange when the parent is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (p *Pool) start() (*child, error) {
	cmd := p.command()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe() // not cmd.StdoutPipe: a read deadline bounds the exchange
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	stderr := &headBuffer{max: maxStderr}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close() // the child holds its own copy; EOF on r means it exited
	p.started.Add(1)
	return &child{cmd: cmd, in: in, out: r, rd: bufio.NewReaderSize(r, readBuffer), stderr: stderr}, nil
}

// kill ends the worker's child, if any, and waits for it. The caller holds the worker.
func (w *worker) kill() {
	c := w.proc
	if c == nil {
		return
	}
	w.proc = nil
	_ = c.cmd.Process.Kill()
	c.in.Close()
	_ = c.cmd.Wait()
	c.out.Close()
}

// Close ends the children, after the exchanges in progress (each bounded by the time limit). Exchanges after Close
// return ErrClosed.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		close(p.done)
		for range p.cfg.Workers {
			w := <-p.idle
			w.kill()
		}
	})
	return nil
}

// headBuffer keeps the first max bytes written to it. Safe for concurrent use: exec copies into it from its own
// goroutine.
type headBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
	max int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// firstLine is the first line kept, without surrounding space.
func (b *headBuffer) firstLine() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	line, _, _ := strings.Cut(strings.TrimSpace(b.buf.String()), "\n")
	return line
}

// Confine is a child's first act, before it reads a request: it limits this process's data segment to limit bytes
// (RLIMIT_DATA, which bounds the Go heap; RLIMIT_AS would count the runtime's address-space reservations), makes
// the collector work hard from half of that, and runs Go code on one thread. limit is the value of Config.Env; one
// that is not a number above 0 sets no memory limit.
func Confine(limit string) error {
	if n, err := strconv.ParseInt(limit, 10, 64); err == nil && n > 0 {
		lim := syscall.Rlimit{Cur: uint64(n), Max: uint64(n)}
		if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &lim); err != nil {
			return fmt.Errorf("limit memory: %w", err)
		}
		debug.SetMemoryLimit(n / 2)
	}
	runtime.GOMAXPROCS(1)
	return nil
}
