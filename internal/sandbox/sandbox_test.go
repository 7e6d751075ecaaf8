package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/internal/sandbox"
)

// childEnv makes the test binary a child that speaks a line protocol (see serve).
const childEnv = "PARLEY_SANDBOX_TEST_CHILD"

// hangWait bounds what must end: it only catches a hang.
const hangWait = time.Minute

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		if err := sandbox.Confine(v); err != nil {
			fmt.Fprintln(os.Stderr, "test child:", err)
			os.Exit(1)
		}
		os.Exit(serve(os.Stdin, os.Stdout))
	}
	goleak.VerifyTestMain(m)
}

// serve answers one line per request line: "echo X" is X; "threads" is GOMAXPROCS; "alloc N" touches N MiB and
// is "ok"; "hang" is nothing; "wait" is "ready", then nothing; "die" and "spew" write to stderr (a line; a MiB with no line break)
// and exit 3.
var keep [][]byte

func serve(r io.Reader, w io.Writer) int {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "echo":
			fmt.Fprintln(w, arg)
		case "threads":
			fmt.Fprintln(w, runtime.GOMAXPROCS(0))
		case "alloc":
			n, _ := strconv.Atoi(arg)
			for range n {
				b := make([]byte, 1<<20)
				for i := range b {
					b[i] = 1
				}
				keep = append(keep, b)
			}
			fmt.Fprintln(w, "ok")
		case "hang":
			time.Sleep(hangWait) // not select{}: the runtime would call that a deadlock and exit
		case "wait":
			fmt.Fprintln(w, "ready")
			time.Sleep(hangWait) // not select{}: the runtime would call that a deadlock and exit
		case "die":
			fmt.Fprintln(os.Stderr, "dying on purpose\nsecond line")
			return 3
		case "spew":
			os.Stderr.Write([]byte(strings.Repeat("x", 1<<20)))
			return 3
		}
	}
	return 0
}

func newPool(t *testing.T, cfg sandbox.Config) *sandbox.Pool {
	t.Helper()
	cfg.Env = childEnv
	if cfg.Timeout == 0 {
		cfg.Timeout = hangWait
	}
	p := sandbox.New(cfg)
	t.Cleanup(func() { p.Close() })
	return p
}

// ask sends one request line and returns the answer line.
func ask(ctx context.Context, p *sandbox.Pool, req string) (string, error) {
	var line string
	err := p.Exchange(ctx,
		func(w io.Writer) error { _, err := fmt.Fprintln(w, req); return err },
		func(r *bufio.Reader) error {
			s, err := r.ReadString('\n')
			line = strings.TrimSuffix(s, "\n")
			return err
		})
	return line, err
}

func TestChildServesExchangesUntilItDies(t *testing.T) {
	p := newPool(t, sandbox.Config{Workers: 1})
	for i := range 3 {
		if got, err := ask(context.Background(), p, "echo "+strconv.Itoa(i)); err != nil || got != strconv.Itoa(i) {
			t.Fatalf("exchange %d: %q, %v", i, got, err)
		}
	}
	if n := p.Started(); n != 1 {
		t.Errorf("%d children started for three exchanges on one worker, want 1", n)
	}
	_, err := ask(context.Background(), p, "die")
	var died *sandbox.ChildError
	if !errors.As(err, &died) || died.Op != sandbox.OpReceive || died.Stderr != "dying on purpose" {
		t.Fatalf("a dying child: %v, want a ChildError on receive with the first line of its stderr", err)
	}
	if got, err := ask(context.Background(), p, "echo again"); err != nil || got != "again" {
		t.Fatalf("after the death: %q, %v", got, err)
	}
	if n := p.Started(); n != 2 {
		t.Errorf("%d children started, want 2 (one died and was started again)", n)
	}
}

func TestChildRunsOnOneThread(t *testing.T) {
	p := newPool(t, sandbox.Config{})
	if got, err := ask(context.Background(), p, "threads"); err != nil || got != "1" {
		t.Fatalf("GOMAXPROCS in the child: %q, %v, want 1", got, err)
	}
}

func TestChildMemoryIsCapped(t *testing.T) {
	// 512 MiB leaves room for the race detector's own allocations.
	p := newPool(t, sandbox.Config{Memory: 512 << 20, Workers: 1})
	if got, err := ask(context.Background(), p, "alloc 16"); err != nil || got != "ok" {
		t.Fatalf("16 MiB under a 512 MiB cap: %q, %v", got, err)
	}
	_, err := ask(context.Background(), p, "alloc 2048")
	var died *sandbox.ChildError
	if !errors.As(err, &died) {
		t.Fatalf("2 GiB under a 512 MiB cap: %v, want the child dead", err)
	}
	t.Logf("the child died: %v", err)
}

func TestChildPastTheTimeLimitIsKilled(t *testing.T) {
	// The limit may pass while the child starts on a busy machine: the hang is refused either way.
	p := newPool(t, sandbox.Config{Timeout: 100 * time.Millisecond, Workers: 1})
	for range 2 {
		if _, err := ask(context.Background(), p, "hang"); !errors.Is(err, sandbox.ErrTimeout) {
			t.Fatalf("a hang: %v, want ErrTimeout", err)
		}
	}
	if n := p.Started(); n != 2 {
		t.Errorf("%d children started for two hangs, want 2 (each was killed)", n)
	}
}

func TestEndedContextKillsTheChild(t *testing.T) {
	p := newPool(t, sandbox.Config{Workers: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := p.Exchange(ctx,
		func(w io.Writer) error { _, err := fmt.Fprintln(w, "wait"); return err },
		func(r *bufio.Reader) error {
			if s, err := r.ReadString('\n'); err != nil || s != "ready\n" {
				return fmt.Errorf("%q, %v", s, err)
			}
			cancel() // the child is in its request now
			_, err := r.ReadString('\n')
			return err
		})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("an exchange whose ctx ended: %v, want context.Canceled", err)
	}
	if got, err := ask(context.Background(), p, "echo next"); err != nil || got != "next" {
		t.Fatalf("after the cancel: %q, %v", got, err)
	}
	if n := p.Started(); n != 2 {
		t.Errorf("%d children started, want 2 (the cancelled one was killed)", n)
	}
	if _, err := ask(ctx, p, "echo late"); !errors.Is(err, context.Canceled) {
		t.Errorf("an exchange on an ended ctx: %v, want context.Canceled", err)
	}
	if n := p.Started(); n != 2 {
		t.Errorf("%d children started, want 2 (an ended ctx starts none)", n)
	}
}

func TestChildStderrIsBounded(t *testing.T) {
	p := newPool(t, sandbox.Config{})
	_, err := ask(context.Background(), p, "spew")
	var died *sandbox.ChildError
	if !errors.As(err, &died) {
		t.Fatalf("a spewing child: %v, want a ChildError", err)
	}
	if n := len(died.Stderr); n == 0 || n > 512 {
		t.Errorf("kept %d bytes of a MiB of stderr, want 1 to 512", n)
	}
}

func TestStartAndCloseErrors(t *testing.T) {
	p := newPool(t, sandbox.Config{Command: func() *exec.Cmd { return exec.Command("/nonexistent/parley") }})
	var start *sandbox.StartError
	if _, err := ask(context.Background(), p, "echo x"); !errors.As(err, &start) {
		t.Errorf("a child that cannot start: %v, want a StartError", err)
	}
	p.Close()
	if _, err := ask(context.Background(), p, "echo x"); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

func TestCommandGetsTheEnvironment(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(t, sandbox.Config{Command: func() *exec.Cmd {
		cmd := exec.Command(exe)
		cmd.Env = []string{"HOME=/"} // the Pool adds childEnv to it
		return cmd
	}})
	if got, err := ask(context.Background(), p, "echo custom"); err != nil || got != "custom" {
		t.Fatalf("a custom command: %q, %v", got, err)
	}
}
