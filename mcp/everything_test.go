package mcp_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/mcp"
	"github.com/parley-chat/parley/toolloop"
)

// everythingEnv names the directory of the npm package
// @modelcontextprotocol/server-everything (its node_modules/... folder).
// scripts/package.json pins it; `npm ci` in scripts installs it at
// scripts/node_modules/@modelcontextprotocol/server-everything.
const everythingEnv = "PARLEY_MCP_EVERYTHING"

// everything returns the server's entry script, skipping the test when the
// package is absent outside CI (in CI its absence fails the test).
func everything(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(everythingEnv)
	if dir == "" {
		dir = filepath.Join("..", "scripts", "node_modules", "@modelcontextprotocol", "server-everything")
	}
	entry := filepath.Join(dir, "dist", "index.js")
	_, err := os.Stat(entry)
	if _, nodeErr := exec.LookPath("node"); err == nil && nodeErr != nil {
		err = nodeErr
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("@modelcontextprotocol/server-everything: %v (install it: cd scripts && npm ci, or set %s)", err, everythingEnv)
		}
		t.Skipf("@modelcontextprotocol/server-everything is not installed (%v); set %s to its directory", err, everythingEnv)
	}
	abs, _ := filepath.Abs(entry)
	return abs
}

// checkEverything lists and calls the reference server's tools.
func checkEverything(t *testing.T, m *mcp.Manager, label string) {
	t.Helper()
	tools, err := m.ListTools(hang(), "alice", label)
	if err != nil {
		t.Fatal(err)
	}
	names := "," + strings.Join(toolNames(tools), ",") + ","
	for _, want := range []string{"echo", "get-sum", "get-env", "get-tiny-image"} {
		if !strings.Contains(names, ","+want+",") {
			t.Errorf("tools %s lack %s", names, want)
		}
	}
	// Every tool it lists is one a request can offer the model.
	ts, err := toolloop.Build(hang(), m, "alice", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ts.Skipped() != 0 {
		t.Errorf("%d of the reference server's tools were left out as malformed", ts.Skipped())
	}
	if _, ok := ts.Lookup("get-sum"); !ok {
		t.Errorf("get-sum is not offered under its own name: %s", ts)
	}
	res, err := m.CallTool(hang(), "alice", label, "echo", []byte(`{"message":"hello from parley"}`))
	if err != nil || !strings.Contains(res.Content, "hello from parley") {
		t.Errorf("echo = %+v, %v", res, err)
	}
	res, err = m.CallTool(hang(), "alice", label, "get-sum", []byte(`{"a":19,"b":23}`))
	if err != nil || !strings.Contains(res.Content, "42") {
		t.Errorf("get-sum = %+v, %v", res, err)
	}
	res, err = m.CallTool(hang(), "alice", label, "get-tiny-image", []byte(`{}`))
	if err != nil || !strings.Contains(res.Content, "[image: image/png") {
		t.Errorf("get-tiny-image = %+v, %v", res, err)
	}
	// A tool that is not in the policy is refused before the server sees it.
	if _, err := m.CallTool(hang(), "bob", label, "get-env", []byte(`{}`)); err == nil {
		t.Error("bob called get-env, which his policy leaves out")
	}
}

func TestEverythingStdio(t *testing.T) {
	entry := everything(t)
	secret := "everything-secret-1234"
	m := newManager(t, fmt.Sprintf(`{
		"servers": {"everything": {"command": "node", "args": [%q, "stdio"], "env": {"EVERYTHING_TOKEN": "${TOKEN}"}}},
		"users": {"alice": {"everything": ["*"]}, "bob": {"everything": ["echo"]}}
	}`, entry), map[string]string{"TOKEN": secret})
	checkEverything(t, m, "everything")
	// get-env returns the server's whole environment: the secret the
	// operator gave it is there, masked.
	res, err := m.CallTool(hang(), "alice", "everything", "get-env", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Content, secret) || !strings.Contains(res.Content, "EVERYTHING_TOKEN") || !strings.Contains(res.Content, "[secret]") {
		t.Errorf("get-env: the secret is not masked, or the variable is missing: %.300s", res.Content)
	}
}

func TestEverythingStreamableHTTP(t *testing.T) {
	entry := everything(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("node", entry, "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitFor(t, "the server to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	m := newManager(t, fmt.Sprintf(`{
		"servers": {"everything": {"url": "http://%s/mcp", "allow_private": true}},
		"users": {"alice": {"everything": ["*"]}, "bob": {"everything": ["echo"]}}
	}`, addr), nil)
	checkEverything(t, m, "everything")
	// Alice and bob have sessions of their own.
	if _, err := m.CallTool(hang(), "bob", "everything", "echo", []byte(`{"message":"b"}`)); err != nil {
		t.Fatal(err)
	}
	if s := status(m, "everything", "bob"); !s.Connected || s.Starts != 1 {
		t.Errorf("bob's session = %+v", s)
	}

	// Without allow_private the same URL is refused at dial time.
	m2 := newManager(t, fmt.Sprintf(`{"servers": {"everything": {"url": "http://localhost:%d/mcp"}}, "users": {"*": {"everything": ["*"]}}}`, port), nil)
	if _, err := m2.ListTools(hang(), "", "everything"); err == nil || !strings.Contains(err.Error(), "address not allowed") {
		t.Errorf("localhost without allow_private: err = %v", err)
	}
}
