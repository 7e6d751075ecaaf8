package mcp_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/parley-chat/parley/mcp"
)

// TestSecretsNeverLogged: a server that crashes after printing its secret
// to stderr has its stderr logged with the secret masked, and the secret
// appears in no log field.
func TestSecretsNeverLogged(t *testing.T) {
	secret := "log-secret-987654"
	c, err := mcp.ParseConfig([]byte(`{"servers": {"go": `+stdioServer("good", `, "API_KEY": "${KEY}"`)+`}, "users": {"*": {"go": ["*"]}}}`),
		func(string) string { return secret })
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	m := mcp.New(c, mcp.WithLogger(zap.New(core)), mcp.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	defer m.Close()
	// The server prints its environment to stderr, then crashes.
	if _, err := m.CallTool(hang(), "", "go", "stderr-env", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	m.CallTool(hang(), "", "go", "crash", json.RawMessage(`{}`))
	waitFor(t, "the stderr log", func() bool { return logs.FilterMessageSnippet("stderr").Len() > 0 })
	sawMask := false
	for _, e := range logs.All() {
		b, _ := json.Marshal(e.ContextMap())
		if strings.Contains(e.Message+string(b), secret) {
			t.Errorf("the secret is in the log: %s %s", e.Message, b)
		}
		sawMask = sawMask || strings.Contains(string(b), "API_KEY=[secret]")
	}
	if !sawMask {
		t.Errorf("the stderr tail with the masked secret was not logged: %v", logs.All())
	}
}
