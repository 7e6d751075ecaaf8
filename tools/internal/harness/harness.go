// Package harness is what the developer tools under tools/ share: a main
// that turns run's error into an exit status, a bin/parley or a
// llama-server started on a free loopback port and waited for until healthy, the flags that let one
// client address put a server under load, lists of numbers in flags, and
// percentiles.
package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/parley-chat/parley/internal/proc"
)

// Main runs run with the command line and stdout under a context that ends
// on SIGINT or SIGTERM, and exits: 2 for a flag error (the flag package has
// printed it), 1 with "name: error" for any other error.
func Main(name string, run func(ctx context.Context, args []string, stdout io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	} else if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Ints reads a comma-separated list of whole numbers, such as a flag's
// "1,2,4" (spaces around each allowed).
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a list of whole numbers: %w", s, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// OneClientLoad are the server flags that let one client address (every
// load tool's connections come from loopback) hold n connections and
// sessions and prompt as fast as it is answered: without them most
// sessions would be refused (creation rate, sessions per client), deleted
// (idle ones past the unused bound) or never connected (connections per
// address).
func OneClientLoad(n int) []string {
	s := strconv.Itoa(n)
	return []string{"--session-creates-per-minute", "0", "--max-sessions-per-client", "0", "--max-unused-per-client", s,
		"--client-store-share", "1", "--max-conns-per-ip", s, "--max-http-conns-per-ip", strconv.Itoa(2*n + 64),
		"--prompts-per-minute", "100000"}
}

// Server is a bin/parley the tool started.
type Server struct {
	*proc.Proc
	Addr string // host:port on loopback
}

// Start runs bin with --addr on a free loopback port and args, its stderr
// to stderr (nil: discarded) and env added to the environment, and waits
// until /health answers 200 or ctx ends. A server that exits or does not
// become healthy is an error (the process is killed).
func Start(ctx context.Context, bin string, args []string, env []string, stderr io.Writer) (*Server, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"--addr", addr}, args...)...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	return start(ctx, "parley", cmd, addr, stderr)
}

// StartLlamaServer runs llama.cpp's llama-server (bin) with --host and
// --port on a free loopback port and args, its output to out (nil:
// discarded), and waits until /health answers 200 (it answers 503 while
// the model loads) or ctx ends. LLAMA_ARG_* variables are left out of its
// environment: they would change its settings behind the flags.
func StartLlamaServer(ctx context.Context, bin string, args []string, out io.Writer) (*Server, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"--host", host, "--port", port}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LLAMA_ARG_") && !strings.HasPrefix(kv, "LLAMA_API_KEY=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout = out
	return start(ctx, "llama-server", cmd, addr, out)
}

// start runs cmd, its stderr to stderr (nil: discarded), and waits for
// addr's /health; name is the program's name in errors.
func start(ctx context.Context, name string, cmd *exec.Cmd, addr string, stderr io.Writer) (*Server, error) {
	if stderr == nil {
		stderr = io.Discard
	}
	cmd.Stderr = stderr
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, err
	}
	s := &Server{Proc: p, Addr: addr}
	switch err := p.WaitHTTP(ctx, "http://"+addr+"/health"); {
	case errors.Is(err, proc.ErrExited):
		return nil, fmt.Errorf("%s exited while starting: %v", name, p.Err())
	case err != nil:
		p.Kill()
		return nil, fmt.Errorf("%s did not become healthy: %w", name, err)
	}
	return s, nil
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.Addr }

// Terminate sends SIGTERM and waits up to grace for the exit; it returns
// the exit error (nil for exit 0), or an error when the server is still
// running after grace (it is left running: Kill ends it).
func (s *Server) Terminate(grace time.Duration) error {
	_ = s.Cmd.Process.Signal(syscall.SIGTERM)
	exited, err := s.WaitFor(grace)
	if !exited {
		return fmt.Errorf("no exit %v after SIGTERM", grace)
	}
	return err
}

// Stop ends the server: SIGTERM, then SIGKILL after grace.
func (s *Server) Stop(grace time.Duration) {
	if s.Terminate(grace) != nil {
		s.Kill()
	}
}

// Percentile is the p-th percentile (0-100) of ds by nearest rank; 0 when
// ds is empty.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}
