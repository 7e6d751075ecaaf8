package mcp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/parley-chat/parley/internal/proc"
)

// waitDelay bounds how long, after a server's process has exited, Parley
// waits for its stderr to close (a child it left behind may hold it).
const waitDelay = time.Second

// passEnv are the variables of Parley's own environment a stdio server
// gets besides those its configuration gives: enough for npx, uvx and
// interpreters to run, and none of Parley's secrets.
var passEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "NODE_PATH", "npm_config_cache"}

// process is one stdio server: the child process and Parley's ends of its
// stdin and stdout pipes. Its stderr goes to a ring buffer.
type process struct {
	cmd    *exec.Cmd
	stdin  *os.File // write end: the client's requests
	stdout *os.File // read end: the server's messages
	stderr *ring
	exited chan struct{} // closed once Wait has returned
	err    error         // Wait's, valid after exited
	once   sync.Once
}

// startProcess starts cfg's command in a process group of its own (so
// that killing it kills what it started, such as npx's node), which the
// kernel kills when Parley dies.
func startProcess(cfg ServerConfig) (*process, error) {
	cmd := exec.Command(cfg.Command, cfg.Args...)
	cmd.Dir = cfg.Dir
	cmd.Env = serverEnv(cfg.Env)
	cmd.SysProcAttr = proc.OwnGroup()
	cmd.WaitDelay = waitDelay
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	p := &process{cmd: cmd, stdin: inW, stdout: outR, stderr: newRing(stderrTail), exited: make(chan struct{})}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, p.stderr
	err = cmd.Start()
	// The child holds its own copies now; Parley keeps only its ends, so
	// that stdout reaches EOF when the child (and its children) are gone.
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("start %s: %w", cfg.Command, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// serverEnv is a stdio server's environment: passEnv from Parley's, then
// the configured entries.
func serverEnv(extra map[string]string) []string {
	var env []string
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// kill ends the process group at once and waits for the process to be
// reaped. Safe to call more than once and after the process exited.
func (p *process) kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		p.stdin.Close()
		p.stdout.Close()
	})
	<-p.exited
}

// stopGrace is how long a stdio server whose connection Parley closed (its
// stdin then reads EOF) gets to exit by itself before its process group is
// killed, as MCP's stdio transport asks: time to act on what it read last,
// such as a call's cancellation.
const stopGrace = 2 * time.Second

// stop ends the process as MCP's stdio transport asks: it closes the
// server's stdin and waits up to grace for it to exit, then kills its group
// (what it started included). Its stdout stays open meanwhile: a server
// that writes to a closed pipe dies of SIGPIPE before it acts on what it
// read.
func (p *process) stop(grace time.Duration) {
	p.stdin.Close()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
	}
	p.kill()
}

// exitErr describes how the process ended, once it has.
func (p *process) exitErr() error {
	select {
	case <-p.exited:
		if p.err == nil {
			return errors.New("the server exited")
		}
		return fmt.Errorf("the server exited: %w", p.err)
	default:
		return nil
	}
}

// pipes is the process's stdin and stdout as the SDK's transport wants
// them: closing either closes both.
func (p *process) pipes() (io.ReadCloser, io.WriteCloser) { return p.stdout, p.stdin }

// ring keeps the last n bytes written to it.
type ring struct {
	mu    sync.Mutex
	buf   []byte
	n     int
	total int64
}

func newRing(n int) *ring { return &ring{n: n} }

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total += int64(len(p))
	if len(p) >= r.n {
		r.buf = append(r.buf[:0], p[len(p)-r.n:]...)
		return len(p), nil
	}
	if over := len(r.buf) + len(p) - r.n; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

// tail returns the bytes kept and how many were written in all.
func (r *ring) tail() (string, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(r.buf), r.total
}
