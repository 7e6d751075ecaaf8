package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/session"
)

// TestStoreCommand: `parley store check` tells a sound file from a damaged
// one, and `parley store repair` moves a damaged one aside and leaves a
// file the server opens.
func TestStoreCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sessions.db")
	st, err := session.OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	var out, errOut bytes.Buffer
	if code := storeCommand([]string{"check", path}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "sound") {
		t.Fatalf("check of a sound file: %d %s %s", code, out.String(), errOut.String())
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := storeCommand([]string{"check", path}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), path) {
		t.Fatalf("check of an empty file: %d %s", code, errOut.String())
	}
	out.Reset()
	if code := storeCommand([]string{"repair", path}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "moved aside") {
		t.Fatalf("repair: %d %s %s", code, out.String(), errOut.String())
	}
	st, err = session.OpenBoltStore(path)
	if err != nil {
		t.Fatalf("open after repair: %v", err)
	}
	st.Close()
	if code := storeCommand([]string{"fix"}, &out, &errOut); code != 2 {
		t.Fatalf("bad usage: exit %d, want 2", code)
	}
}

// TestMaxTokensBelowCtx: a default reply cap that fills the context is
// refused at startup with a message naming both flags.
func TestMaxTokensBelowCtx(t *testing.T) {
	getenv := func(string) string { return "" }
	_, err := parseFlags([]string{"--model", "m.gguf", "--ctx", "256", "--max-tokens", "256"}, getenv, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--max-tokens 256 must be below --ctx 256") {
		t.Fatalf("want a refusal, got %v", err)
	}
	if _, err := parseFlags([]string{"--model", "m.gguf", "--ctx", "512", "--max-tokens", "256"}, getenv, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}
