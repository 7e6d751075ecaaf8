package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/mcp"
	"github.com/parley-chat/parley/toolloop"
)

// hangTimeout is how long a test waits for something that must happen:
// it only catches a hang.
const hangTimeout = 2 * time.Minute

// stdioServer is the configuration of the test binary as a stdio server in mode.
func stdioServer(mode string, extra string) string {
	return fmt.Sprintf(`{"command": %q, "env": {%q: %q%s}}`, os.Args[0], "PARLEY_MCP_TEST_SERVER", mode, extra)
}

// newManager parses cfg and starts a Manager that restarts quickly.
func newManager(t *testing.T, cfg string, env map[string]string) *mcp.Manager {
	t.Helper()
	c, err := mcp.ParseConfig([]byte(cfg), func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	m := mcp.New(c, mcp.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	t.Cleanup(func() { m.Close() })
	return m
}

// hang is a context that ends the calls made on it after hangTimeout.
func hang() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangTimeout)
	_ = cancel // ends with the test process; a hang fails by timeout
	return ctx
}

func call(t *testing.T, m *mcp.Manager, user, server, tool, args string) (toolloop.Result, error) {
	t.Helper()
	return m.CallTool(hang(), user, server, tool, json.RawMessage(args))
}

func mustCall(t *testing.T, m *mcp.Manager, user, server, tool, args string) string {
	t.Helper()
	r, err := call(t, m, user, server, tool, args)
	if err != nil {
		t.Fatalf("%s/%s as %q: %v", server, tool, user, err)
	}
	return r.Content
}

func toolNames(tools []toolloop.RemoteTool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	return out
}

// waitFor polls cond until it holds (it counts events, not time: the
// deadline only catches a hang).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func status(m *mcp.Manager, server, user string) mcp.Status {
	for _, s := range m.Statuses() {
		if s.Server == server && s.User == user {
			return s
		}
	}
	return mcp.Status{}
}

func TestStdioPolicyAndIsolation(t *testing.T) {
	m := newManager(t, `{
		"servers": {"go": `+stdioServer("good", "")+`},
		"users": {"alice": {"go": ["*"]}, "bob": {"go": ["echo", "remember", "recall"]}}
	}`, nil)
	tools, err := m.ListTools(hang(), "alice", "go")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(toolNames(tools), ","); !strings.Contains(got, "echo") || !strings.Contains(got, "add") {
		t.Fatalf("alice's tools = %s", got)
	}
	bobs, err := m.ListTools(hang(), "bob", "go")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(toolNames(bobs), ","); got != "echo,recall,remember" && got != "echo,remember,recall" {
		t.Errorf("bob's tools = %s, want echo, remember and recall", got)
	}
	if got := mustCall(t, m, "alice", "go", "add", `{"a":2,"b":40}`); got != "42" {
		t.Errorf("add = %q", got)
	}
	if _, err := call(t, m, "bob", "go", "add", `{"a":1,"b":1}`); !errors.Is(err, mcp.ErrNotAllowed) {
		t.Errorf("bob calling add: err = %v, want ErrNotAllowed", err)
	}
	if _, err := m.ListTools(hang(), "carol", "go"); !errors.Is(err, mcp.ErrNotAllowed) {
		t.Errorf("carol (no policy) listing: err = %v", err)
	}
	if got := m.Servers("carol"); len(got) != 0 {
		t.Errorf("carol's servers = %v", got)
	}
	// Each user has a session (a process) of their own: bob does not see
	// what alice left in hers.
	mustCall(t, m, "bob", "go", "remember", `{"text":"bob's secret plan"}`)
	if got := mustCall(t, m, "alice", "go", "recall", `{}`); strings.Contains(got, "plan") {
		t.Errorf("alice recalls %q: bob's session leaked into hers", got)
	}
	if got := mustCall(t, m, "bob", "go", "recall", `{}`); got != "memory: bob's secret plan" {
		t.Errorf("bob recalls %q", got)
	}
	if _, err := call(t, m, "alice", "go", "nosuch", `{}`); err == nil || !strings.Contains(err.Error(), "lists no tool") {
		t.Errorf("a tool the server does not list: err = %v", err)
	}
	if _, err := call(t, m, "alice", "go", "echo", `[1,2]`); err == nil || !strings.Contains(err.Error(), "JSON object") {
		t.Errorf("arguments that are not an object: err = %v", err)
	}
}

func TestStdioSecretsMasked(t *testing.T) {
	secret := "s3cr3t-token-value"
	m := newManager(t, `{
		"servers": {"go": `+stdioServer("good", `, "API_KEY": "${KEY}"`)+`},
		"users": {"*": {"go": ["*"]}}
	}`, map[string]string{"KEY": secret})
	got := mustCall(t, m, "", "go", "env", `{"name":"API_KEY"}`)
	if strings.Contains(got, secret) || got != "API_KEY=[secret]" {
		t.Errorf("env result = %q: the secret reached the result", got)
	}
	// The server gets none of Parley's own environment beyond the basics.
	t.Setenv("PARLEY_TEST_LEAK", "leaked")
	if got := mustCall(t, m, "", "go", "env", `{"name":"PARLEY_TEST_LEAK"}`); got != "PARLEY_TEST_LEAK=" {
		t.Errorf("Parley's environment reached the server: %q", got)
	}
	if _, err := mcp.ParseConfig([]byte(`{"servers": {"go": `+stdioServer("good", `, "K": "${UNSET_VAR}"`)+`}}`), func(string) string { return "" }); err == nil ||
		!strings.Contains(err.Error(), "UNSET_VAR") {
		t.Errorf("an unset variable: err = %v", err)
	}
}

func TestStdioHangFailsOnlyThatCall(t *testing.T) {
	m := newManager(t, `{
		"servers": {"go": `+stdioServer("good", "")+`},
		"users": {"*": {"go": ["*"]}},
		"call_timeout": "2s"
	}`, nil)
	mustCall(t, m, "alice", "go", "echo", `{"text":"warm"}`)
	hung := make(chan error, 1)
	go func() {
		_, err := call(t, m, "alice", "go", "hang", `{}`)
		hung <- err
	}()
	// While alice's call hangs, bob's calls go through.
	for i := range 3 {
		if got := mustCall(t, m, "bob", "go", "echo", fmt.Sprintf(`{"text":"%d"}`, i)); got != fmt.Sprint(i) {
			t.Errorf("bob's echo = %q", got)
		}
	}
	select {
	case err := <-hung:
		t.Fatalf("the hanging call returned before bob's three: %v", err)
	default:
	}
	err := <-hung
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("hanging call: err = %v", err)
	}
	// Alice's session is started again, and works.
	waitFor(t, "alice's session to restart", func() bool { s := status(m, "go", "alice"); return s.Starts == 2 && s.Connected })
	if got := mustCall(t, m, "alice", "go", "echo", `{"text":"back"}`); got != "back" {
		t.Errorf("after the restart: %q", got)
	}
	if s := status(m, "go", "bob"); s.Starts != 1 {
		t.Errorf("bob's session started %d times, want 1", s.Starts)
	}
}

func TestStdioCrashRestarts(t *testing.T) {
	m := newManager(t, `{"servers": {"go": `+stdioServer("good", "")+`}, "users": {"*": {"go": ["*"]}}}`, nil)
	pid1 := mustCall(t, m, "", "go", "pid", `{}`)
	_, err := call(t, m, "", "go", "crash", `{}`)
	if err == nil {
		t.Fatal("a call whose server crashed succeeded")
	}
	waitFor(t, "the server to start again", func() bool { s := status(m, "go", ""); return s.Starts == 2 && s.Connected })
	pid2 := mustCall(t, m, "", "go", "pid", `{}`) // waits for the restart
	if pid1 == pid2 {
		t.Errorf("the same process (%s) answered after the crash", pid1)
	}
	if s := status(m, "go", ""); s.Starts != 2 {
		t.Errorf("starts = %d, want 2", s.Starts)
	}
}

func TestStdioFloodAndHugeResults(t *testing.T) {
	m := newManager(t, `{
		"servers": {"go": `+stdioServer("flood", "")+`},
		"users": {"*": {"go": ["*"]}},
		"max_result_bytes": 1000,
		"max_frame_bytes": 100000
	}`, nil)
	// Megabytes on stderr do not get in the way.
	if got := mustCall(t, m, "", "go", "echo", `{"text":"hi"}`); got != "hi" {
		t.Errorf("echo = %q", got)
	}
	got := mustCall(t, m, "", "go", "big", `{"n":50000}`)
	if len(got) > 1000 || !strings.Contains(got, "[cut: the result was 50000 bytes") {
		t.Errorf("a 50 kB result came back as %d bytes: %.80q...", len(got), got)
	}
	// A message over max_frame_bytes fails the call and ends the session.
	if _, err := call(t, m, "", "go", "big", `{"n":500000}`); err == nil {
		t.Error("a 500 kB message was accepted with max_frame_bytes 100000")
	}
	waitFor(t, "the server to start again", func() bool { s := status(m, "go", ""); return s.Starts == 2 && s.Connected })
	if got := mustCall(t, m, "", "go", "echo", `{"text":"again"}`); got != "again" {
		t.Errorf("after the oversized message: %q", got)
	}
}

func TestStdioToolListChanged(t *testing.T) {
	m := newManager(t, `{"servers": {"go": `+stdioServer("good", "")+`}, "users": {"*": {"go": ["*"]}}}`, nil)
	mustCall(t, m, "", "go", "grow", `{}`)
	waitFor(t, "the tool list to be fetched again", func() bool { return status(m, "go", "").Refreshes >= 1 })
	tools, err := m.ListTools(hang(), "", "go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(","+strings.Join(toolNames(tools), ",")+",", ",grown,") {
		t.Fatalf("tools after grow = %v", toolNames(tools))
	}
	if got := mustCall(t, m, "", "go", "grown", `{}`); got != "grown" {
		t.Errorf("grown = %q", got)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestStdioKilledWithManager(t *testing.T) {
	c, err := mcp.ParseConfig([]byte(`{"servers": {"go": `+stdioServer("good", "")+`}, "users": {"*": {"go": ["*"]}}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := mcp.New(c)
	r, err := m.CallTool(hang(), "", "go", "pid", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	server, _ := strconv.Atoi(r.Content)
	r, err = m.CallTool(hang(), "", "go", "spawn", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(r.Content)
	if !alive(server) || !alive(child) {
		t.Fatal("the server or its child is not running")
	}
	m.Close()
	if alive(server) {
		t.Errorf("the server (pid %d) outlived Close", server)
	}
	// The child is in the server's process group: killed with it. It is
	// not Parley's to reap, so wait for init to.
	waitFor(t, "the server's child to die", func() bool { return !alive(child) })
}

func TestLiarServer(t *testing.T) {
	m := newManager(t, `{"servers": {"liar": `+stdioServer("liar", "")+`}, "users": {"*": {"liar": ["*"]}}}`, nil)
	ts, err := toolloop.Build(hang(), m, "", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range ts.Tools() {
		names = append(names, tl.Name)
		if len(tl.Description) > parley.MaxToolDescription {
			t.Errorf("%s: a description of %d bytes reaches the model", tl.Name, len(tl.Description))
		}
	}
	if got := strings.Join(names, ","); got != "honest,wordy" {
		t.Errorf("tools exposed = %s, want honest,wordy (the rest lie about their schema)", got)
	}
	if _, err := call(t, m, "", "liar", "honest", `{"a":1}`); err == nil {
		t.Error("a result that is not a result was accepted")
	}
	if got := mustCall(t, m, "", "liar", "wordy", `{}`); got != "wordy ok" {
		t.Errorf("wordy = %q", got)
	}
}

func TestHTTPServer(t *testing.T) {
	secret := "Bearer tok-0123456789"
	srv := httptest.NewServer(httpServer())
	t.Cleanup(srv.Close)
	cfg := func(allow bool) string {
		return fmt.Sprintf(`{"servers": {"h": {"url": %q, "headers": {"Authorization": "${AUTH}"}, "allow_private": %v}}, "users": {"*": {"h": ["*"]}}, "start_timeout": "30s"}`,
			srv.URL, allow)
	}
	env := map[string]string{"AUTH": secret}

	// Loopback is refused unless the operator allows it.
	m := newManager(t, cfg(false), env)
	_, err := m.ListTools(hang(), "", "h")
	if err == nil || !strings.Contains(err.Error(), "address not allowed") {
		t.Fatalf("a loopback URL without allow_private: err = %v", err)
	}
	m.Close()

	m = newManager(t, cfg(true), env)
	if got := mustCall(t, m, "", "h", "add", `{"a":1,"b":2}`); got != "3" {
		t.Errorf("add = %q", got)
	}
	// The header reaches the server; its value never comes back.
	if got := mustCall(t, m, "", "h", "header", `{}`); got != "authorization: [secret]" {
		t.Errorf("header = %q", got)
	}
	// Users have sessions of their own over HTTP too.
	mustCall(t, m, "alice", "h", "remember", `{"text":"alice only"}`)
	if got := mustCall(t, m, "bob", "h", "recall", `{}`); strings.Contains(got, "alice") {
		t.Errorf("bob recalls %q", got)
	}
}

func TestHTTPRedirectElsewhereRefused(t *testing.T) {
	target := httptest.NewServer(httpServer())
	t.Cleanup(target.Close)
	var sawAuth []string
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawAuth = append(sawAuth, r.Header.Get("Authorization"))
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redir.Close)
	m := newManager(t, fmt.Sprintf(`{"servers": {"h": {"url": %q, "headers": {"Authorization": "Bearer abcdefgh"}, "allow_private": true}}, "users": {"*": {"h": ["*"]}}, "start_timeout": "30s"}`,
		redir.URL+"/mcp"), nil)
	_, err := m.ListTools(hang(), "", "h")
	if err == nil || !strings.Contains(err.Error(), "another origin") {
		t.Fatalf("a redirect to another origin: err = %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	bad := map[string]string{
		"both":          `{"servers": {"x": {"command": "a", "url": "http://h/"}}}`,
		"neither":       `{"servers": {"x": {}}}`,
		"scheme":        `{"servers": {"x": {"url": "file:///etc/passwd"}}}`,
		"userinfo":      `{"servers": {"x": {"url": "http://u:p@h/"}}}`,
		"label":         `{"servers": {"a b": {"command": "a"}}}`,
		"unknown field": `{"servers": {"x": {"command": "a", "comand": "b"}}}`,
		"policy server": `{"servers": {"x": {"command": "a"}}, "users": {"*": {"y": ["*"]}}}`,
		"empty tools":   `{"servers": {"x": {"command": "a"}}, "users": {"*": {"x": []}}}`,
	}
	for name, cfg := range bad {
		if _, err := mcp.ParseConfig([]byte(cfg), nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
