// Package redistest runs a real redis-server (Debian's redis-server
// package) on a free loopback port for tests: no mock stands in for the
// store that replicas share. Tests that need it skip, saying why, only
// when redis-server is not installed.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/proc"
)

// Server is one redis-server with append-only persistence that fsyncs
// every write, so a restart keeps everything it acknowledged.
type Server struct {
	Addr string // 127.0.0.1:port
	dir  string
	bin  string
	p    *proc.Proc
	out  proc.Buffer
}

// Start starts redis-server in a temporary directory, waits until it
// answers PING, and stops it at the end of the test. It skips the test when
// redis-server is not installed.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Skip("redis-server is not installed (apt-get install redis-server): skipping the Redis tests")
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{Addr: addr, dir: tb.TempDir(), bin: bin}
	s.Restart(tb)
	tb.Cleanup(func() {
		s.Kill()
		if tb.Failed() {
			tb.Logf("redis-server log:\n%s", s.out.String())
		}
	})
	return s
}

// URL is the redis:// URL of database db.
func (s *Server) URL(db int) string { return fmt.Sprintf("redis://%s/%d", s.Addr, db) }

// Restart starts the server again (after Kill) on the same port and data
// directory, and waits until it answers.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	p, err := Launch(s.bin, s.Addr, s.dir, &s.out)
	if err != nil {
		tb.Fatalf("%v\n%s", err, s.out.String())
	}
	s.p = p
}

// Launch starts redis-server (bin) on addr (127.0.0.1:port) with its data
// in dir, append-only and fsynced on every write, its output to out (nil:
// discarded), and waits up to 10 s until it answers PING. Not a test
// helper only: tools/storebench runs its server with it.
func Launch(bin, addr, dir string, out io.Writer) (*proc.Proc, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = out, out
	// Redis forks for append-only-file rewrites, and the child holds the
	// output pipe: do not let Wait wait for it after a kill.
	cmd.WaitDelay = time.Second
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err := ping(addr); err == nil {
			return p, nil
		}
		select {
		case <-p.Done():
			return nil, fmt.Errorf("redis-server exited: %v", p.Err())
		case <-ctx.Done():
			p.Kill()
			return nil, fmt.Errorf("redis-server did not answer on %s", addr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill kills the server at once (SIGKILL: what it acknowledged must survive
// on its append-only file) and waits for it to exit. Safe to call twice.
func (s *Server) Kill() {
	if s.p != nil {
		s.p.Kill()
	}
}

// ping sends PING in the inline protocol and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("redis answered %q", line)
	}
	return nil
}
