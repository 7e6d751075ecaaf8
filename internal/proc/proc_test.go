package proc_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/internal/proc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFreeAddr(t *testing.T) {
	addr, err := proc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("FreeAddr = %q (%v), want a loopback host:port", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the port is not free: %v", err)
	}
	ln.Close()
}

func TestExitAndOutput(t *testing.T) {
	var out proc.Buffer
	cmd := exec.Command("sh", "-c", "echo hello; echo oops >&2; exit 3")
	cmd.Stdout, cmd.Stderr = &out, &out
	p, err := proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	exited, err := p.WaitFor(time.Minute) // catches a hang only
	var ee *exec.ExitError
	if !exited || !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("WaitFor = %v, %v; want exit status 3", exited, err)
	}
	if got := out.String(); got != "hello\noops\n" {
		t.Fatalf("output %q", got)
	}
	if !errors.As(p.Err(), &ee) {
		t.Fatalf("Err = %v after the exit", p.Err())
	}
}

func TestWaitForAndKill(t *testing.T) {
	p, err := proc.Start(exec.Command("sleep", "30"))
	if err != nil {
		t.Fatal(err)
	}
	if exited, _ := p.WaitFor(50 * time.Millisecond); exited {
		t.Fatal("sleep 30 exited at once")
	}
	p.Kill()
	select {
	case <-p.Done():
	default:
		t.Fatal("Done open after Kill")
	}
	if p.Err() == nil {
		t.Fatal("a killed process exited 0")
	}
}

func TestStartFails(t *testing.T) {
	if _, err := proc.Start(exec.Command("/nonexistent/server")); err == nil {
		t.Fatal("started a missing binary")
	}
}

func TestWaitHTTP(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable) // loading
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	sleeper := func(t *testing.T) *proc.Proc {
		p, err := proc.Start(exec.Command("sleep", "30"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		return p
	}

	t.Run("answers 200 after 503s", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sleeper(t).WaitHTTP(ctx, srv.URL); err != nil {
			t.Fatal(err)
		}
		if n := calls.Load(); n != 3 {
			t.Fatalf("%d polls, want 3", n)
		}
	})
	t.Run("the process exits first", func(t *testing.T) {
		p, err := proc.Start(exec.Command("sh", "-c", "exit 1"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Nothing listens on a free port: only the exit can end the wait.
		addr, _ := proc.FreeAddr()
		if err := p.WaitHTTP(ctx, "http://"+addr+"/health"); !errors.Is(err, proc.ErrExited) || !strings.Contains(err.Error(), "exit status 1") {
			t.Fatalf("WaitHTTP = %v, want ErrExited with the exit status", err)
		}
	})
	t.Run("the deadline passes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		addr, _ := proc.FreeAddr()
		if err := sleeper(t).WaitHTTP(ctx, "http://"+addr+"/health"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitHTTP = %v, want the deadline", err)
		}
	})
}
