package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// waitServer is an MCP server over Streamable HTTP whose tool wait blocks
// until its context ends: started has a value when a call begins, ended
// when its handler saw its context end (the test's end releases the others), and cancels the request id of each
// notifications/cancelled the server received.
func waitServer(t *testing.T) (url string, started, ended chan struct{}, cancels chan string) {
	started, ended, cancels = make(chan struct{}, 8), make(chan struct{}, 8), make(chan string, 8)
	quit := make(chan struct{})
	s := sdk.NewServer(&sdk.Implementation{Name: "waiter", Version: "1"}, nil)
	type none struct{}
	sdk.AddTool(s, &sdk.Tool{Name: "wait"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
			ended <- struct{}{}
		case <-quit:
		}
		return nil, nil, ctx.Err()
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			var m struct {
				Method string `json:"method"`
				Params struct {
					RequestID any `json:"requestId"`
				} `json:"params"`
			}
			if json.Unmarshal(b, &m) == nil && m.Method == "notifications/cancelled" {
				cancels <- fmt.Sprint(m.Params.RequestID)
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	// Runs before srv.Close, which waits for every request: a handler
	// that never saw its context end must not hold it.
	t.Cleanup(func() { close(quit) })
	return srv.URL, started, ended, cancels
}

// TestCallCancelledOnServer: a call whose context ends sends MCP's
// notifications/cancelled to the server, and the server's handler sees its
// context end: when the client leaves, and when the call's time is up (the
// session then starts again, after the cancellation went out).
func TestCallCancelledOnServer(t *testing.T) {
	url, started, ended, cancels := waitServer(t)
	m := newManager(t, fmt.Sprintf(`{"servers": {"w": {"url": %q, "allow_private": true, "call_timeout": "1s"}},
		"users": {"*": {"w": ["*"]}}, "start_timeout": "30s"}`, url), nil)

	// The client leaves.
	ctx, cancel := context.WithCancel(hang())
	errc := make(chan error, 1)
	go func() {
		_, err := m.CallTool(ctx, "alice", "w", "wait", json.RawMessage(`{}`))
		errc <- err
	}()
	recv(t, started, "the call to start")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("left call: err = %v", err)
	}
	recv(t, cancels, "the cancellation of the left call")
	recv(t, ended, "the left call's handler to end")

	// The call's time is up: the cancellation reaches the server before
	// the session starts again.
	_, err := m.CallTool(context.Background(), "alice", "w", "wait", json.RawMessage(`{}`))
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("timed-out call: err = %v", err)
	}
	recv(t, started, "the timed-out call to have started")
	recv(t, cancels, "the cancellation of the timed-out call")
	recv(t, ended, "the timed-out call's handler to end")
	waitFor(t, "the session to start again", func() bool { s := status(m, "w", "alice"); return s.Starts == 2 && s.Connected })
}

// recv waits for a value of ch (the deadline only catches a hang).
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangTimeout):
		t.Fatalf("gave up waiting for %s", what)
		panic("unreachable")
	}
}

// TestStdioCallCancelledOnServer: over stdio too, a call whose client
// leaves and one over its time cap are cancelled in the server (its wait
// tool marks each cancellation with a file); the timed-out one before its
// process is killed to start the session again.
func TestStdioCallCancelledOnServer(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, `{"servers": {"go": `+stdioServer("good", fmt.Sprintf(`, "CANCEL_DIR": %q`, dir))+`},
		"users": {"*": {"go": ["*"]}}, "call_timeout": "1s"}`, nil)
	mustCall(t, m, "alice", "go", "echo", `{"text":"warm"}`)
	marked := func(name string) bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }

	ctx, cancel := context.WithCancel(hang())
	errc := make(chan error, 1)
	go func() {
		_, err := m.CallTool(ctx, "alice", "go", "wait", json.RawMessage(`{"name":"left"}`))
		errc <- err
	}()
	waitFor(t, "the call to start in the server", func() bool { return marked("left.started") })
	cancel()
	if err := recv(t, errc, "the left call to return"); !errors.Is(err, context.Canceled) {
		t.Errorf("left call: err = %v", err)
	}
	waitFor(t, "the left call's cancellation in the server", func() bool { return marked("left") })

	before := status(m, "go", "alice").Starts
	_, err := m.CallTool(context.Background(), "alice", "go", "wait", json.RawMessage(`{"name":"late"}`))
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("timed-out call: err = %v", err)
	}
	waitFor(t, "the session to start again", func() bool { s := status(m, "go", "alice"); return s.Starts == before+1 && s.Connected })
	if !marked("late") {
		t.Errorf("the timed-out call was not cancelled in the server before it was started again (it started: %v)",
			marked("late.started"))
	}
}
