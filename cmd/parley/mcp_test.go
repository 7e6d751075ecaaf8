package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMCPConfigFlag: --mcp-config reads the file when the flags are parsed,
// so a bad file stops Parley before it listens; "${NAME}" comes from the
// environment (PARLEY_MCP_CONFIG names the file as the flag does).
func TestMCPConfigFlag(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "mcp.json")
	os.WriteFile(good, []byte(`{"servers": {"s": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}}, "users": {"*": {"s": ["*"]}}}`), 0o600)
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"servers": {"s": {}}}`), 0o600)
	env := map[string]string{"TOKEN": "abcdefgh"}
	getenv := func(k string) string { return env[k] }

	cfg, err := parseFlags([]string{"--model", "m.gguf", "--mcp-config", good}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.mcp == nil || cfg.mcp.Servers["s"].Headers["Authorization"] != "Bearer abcdefgh" {
		t.Fatalf("mcp config = %+v", cfg.mcp)
	}
	if _, err := parseFlags([]string{"--model", "m.gguf", "--mcp-config", bad}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), "--mcp-config") {
		t.Errorf("a bad file: err = %v", err)
	}
	env["PARLEY_MCP_CONFIG"] = good
	delete(env, "TOKEN")
	if _, err := parseFlags([]string{"--model", "m.gguf"}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), "TOKEN") {
		t.Errorf("an unset ${TOKEN}: err = %v", err)
	}
}
