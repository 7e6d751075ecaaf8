package main

// End-to-end tests of the real binary: signals, exit codes, and
// conversations that survive kill -9. They build the binary (or use
// $PARLEY_BIN, which scripts/test.sh sets to a fresh bin/parley) and run it
// on the tiny test model, on loopback.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// server is one run of the binary.
type server struct {
	*proc.Proc
	addr   string
	stderr proc.Buffer
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := proc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// start runs the binary with args on a free port and waits until /health
// says the model is loaded.
func start(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	return launch(t, bin, append([]string{"--model", testmodel.Path(t)}, args...)...)
}

// launch is start without a --model of its own (args give the models), in
// a fresh HOME and data folder unless args name a --data-dir.
func launch(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	s := &server{addr: freeAddr(t)}
	args = append([]string{"--addr", s.addr, "--log-format", "json",
		"--threads", "1", "--ctx", "512", "--parallel", "2", "--temperature", "0"}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir())
	cmd.Stderr = &s.stderr
	p, err := proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	s.Proc = p
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("server log:\n%s", s.log())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), hangWait)
	defer cancel()
	if err := p.WaitHTTP(ctx, "http://"+s.addr+"/health"); err != nil {
		t.Fatalf("the server did not become healthy: %v\n%s", err, s.log())
	}
	return s
}

func (s *server) log() string { return s.stderr.String() }

// hangWait bounds the waits for what must happen (a server healthy, an
// exit, a reply): it only catches a hang, so it is minutes, far past a busy
// machine's time.
const hangWait = 2 * time.Minute

// wait returns the exit error (nil for exit 0) within d.
func (s *server) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	exited, err := s.WaitFor(d)
	if !exited {
		t.Fatalf("the server did not exit within %v\n%s", d, s.log())
	}
	return err
}

func (s *server) dial(t *testing.T, query string) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+s.addr+"/ws?format=json"+query, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func read(t *testing.T, ws *websocket.Conn) jsonmode.Message {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(hangWait))
	var m jsonmode.Message
	if err := ws.ReadJSON(&m); err != nil {
		t.Fatalf("read: %v", err)
	}
	return m
}

// turn sends a prompt and returns the done event.
func turn(t *testing.T, ws *websocket.Conn, prompt string, params map[string]any) jsonmode.Message {
	t.Helper()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": prompt, "params": params})
	for {
		m := read(t, ws)
		switch m.Type {
		case "token":
		case "done":
			return m
		default:
			t.Fatalf("during the reply to %q: %+v", prompt, m)
		}
	}
}

func TestBinary(t *testing.T) {
	bin := testbin.Parley(t)

	// SIGTERM with a reply streaming: the reply completes within the drain
	// deadline, the socket closes with 1001, and the process exits 0.
	t.Run("SIGTERM drains and exits 0", func(t *testing.T) {
		s := start(t, bin, "--store", "memory", "--drain-timeout", "10s")
		ws := s.dial(t, "")
		read(t, ws) // session
		ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time",
			"params": map[string]any{"max_tokens": 300, "grammar": `root ::= [a-z ]{300,}`}})
		if m := read(t, ws); m.Type != "token" {
			t.Fatalf("want a token first, got %+v", m)
		}
		if err := s.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var done bool
		var cerr *websocket.CloseError
		for {
			ws.SetReadDeadline(time.Now().Add(hangWait))
			var m jsonmode.Message
			err := ws.ReadJSON(&m)
			if errors.As(err, &cerr) {
				break
			}
			if err != nil {
				t.Fatalf("after SIGTERM: %v", err)
			}
			if m.Type == "done" {
				done = m.FinishReason == "length"
			}
		}
		if !done || cerr.Code != websocket.CloseGoingAway {
			t.Fatalf("reply completed %v, close code %d; want a completed reply then 1001", done, cerr.Code)
		}
		if err := s.wait(t, hangWait); err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, s.log())
		}
		if !strings.Contains(s.log(), `"msg":"stopped"`) {
			t.Errorf("no \"stopped\" log line:\n%s", s.log())
		}
	})

	// kill -9 loses nothing that was committed: after a restart on the
	// same data directory the session resumes with its whole history, the
	// next reply is prompted with it (its KV cache rebuilt from scratch),
	// and a turn that was streaming at the kill left no trace. (Without the
	// KV swap's files: kvswap_test.go covers the restart with them.)
	t.Run("conversation survives kill -9", func(t *testing.T) {
		dataDir := t.TempDir()
		args := []string{"--store", "bolt", "--data-dir", dataDir, "--max-tokens", "24", "--kv-cache-disk", "0"}
		// The kill lands after the second turn's first token, but the
		// server may have generated the whole reply by then: such a try
		// shows it complete after the restart, and the test tries again in
		// a new conversation.
		s := start(t, bin, args...)
		var open, again jsonmode.Message
		var first jsonmode.Message
		var s2 *server
		var ws2 *websocket.Conn
		for try := 1; ; try++ {
			ws := s.dial(t, "")
			open = read(t, ws)
			if open.Type != "session" || open.SessionID() == "" {
				t.Fatalf("first message: %+v", open)
			}
			first = turn(t, ws, "Lily found a red ball", nil)
			if first.FinishReason == "error" || first.Content == "" {
				t.Fatalf("first turn: %+v", first)
			}
			// A second turn is streaming when the process dies.
			ws.WriteJSON(map[string]any{"type": "prompt", "content": "Tell me everything",
				"params": map[string]any{"max_tokens": 400, "grammar": `root ::= [a-z ]{400,}`}})
			if m := read(t, ws); m.Type != "token" {
				t.Fatalf("want a token, got %+v", m)
			}
			if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var ee *exec.ExitError
			if err := s.wait(t, hangWait); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("want death by SIGKILL, got %v", err)
			}

			s2 = start(t, bin, args...)
			ws2 = s2.dial(t, "&session="+open.SessionID())
			again = read(t, ws2)
			if len(again.Messages) != 4 || again.Messages[3].Interrupted || len(again.Messages[3].Content) < 400 {
				break
			}
			if try == 5 {
				t.Fatalf("in %d tries the server finished the second reply before the kill each time", try)
			}
			t.Logf("try %d: the second reply was complete before the kill; again", try)
			ws2.Close()
			s = s2
		}
		// The first turn whole; the second, stored when it was accepted,
		// as its prompt and its reply so far marked interrupted.
		want := []parley.Message{{Role: parley.RoleUser, Content: "Lily found a red ball"}, {Role: parley.RoleAssistant, Content: first.Content}}
		if again.Type != "session" || again.SessionID() != open.SessionID() || !again.Resumed || len(again.Messages) != 4 ||
			!equalMessages(again.Messages[:2], want) || again.Messages[2].Content != "Tell me everything" || !again.Messages[3].Interrupted {
			t.Fatalf("after kill -9: %+v\nwant messages %+v, then the prompt in flight and its reply interrupted", again, want)
		}
		next := turn(t, ws2, "What did Lily do next?", nil)
		if next.FinishReason == "error" || next.Content == "" {
			t.Fatalf("reply after the restart: %+v", next)
		}
		// Prompted with the whole first turn, none of it from a cache that
		// died with the process.
		if next.Usage.PromptTokens <= first.Usage.PromptTokens+first.Usage.CompletionTokens || next.Usage.CachedPromptTokens != 0 {
			t.Fatalf("second turn usage %+v after first turn usage %+v: the history was not in the prompt", next.Usage, first.Usage)
		}
		ws3 := s2.dial(t, "&session="+open.SessionID())
		want = append(append([]parley.Message(nil), again.Messages...),
			parley.Message{Role: parley.RoleUser, Content: "What did Lily do next?"}, parley.Message{Role: parley.RoleAssistant, Content: next.Content})
		if m := read(t, ws3); !equalMessages(m.Messages, want) {
			t.Fatalf("history after the second turn: %+v", m.Messages)
		}
		if err := s2.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := s2.wait(t, hangWait); err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	})

	// --max-prompt-tokens reaches the server: a longer prompt is refused.
	t.Run("max-prompt-tokens flag", func(t *testing.T) {
		s := start(t, bin, "--store", "memory", "--max-prompt-tokens", "16")
		ws := s.dial(t, "")
		read(t, ws)
		ws.WriteJSON(map[string]any{"type": "prompt", "content": strings.Repeat("Lily saw a big dog. ", 10)})
		if m := read(t, ws); m.Type != "error" || m.Code != parley.ETooLarge {
			t.Fatalf("over the cap: %+v", m)
		}
		if m := turn(t, ws, "Lily saw a dog.", map[string]any{"max_tokens": 4}); m.FinishReason == "error" {
			t.Fatalf("under the cap: %+v", m)
		}
	})

	// A bad model is a clear error and exit status 1, not a stack trace.
	t.Run("missing model exits 1", func(t *testing.T) {
		cmd := exec.Command(bin, "--model", filepath.Join(t.TempDir(), "nope.gguf"), "--addr", freeAddr(t), "--store", "memory")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("exit: %v\n%s", err, out)
		}
		if bytes.Contains(out, []byte("goroutine ")) || !bytes.Contains(out, []byte("nope.gguf")) {
			t.Fatalf("want a clear error naming the file:\n%s", out)
		}
	})
}

func equalMessages(a, b []parley.Message) bool {
	return reflect.DeepEqual(a, b)
}
