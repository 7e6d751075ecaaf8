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

// TestStoreCommandOnALiveStore: on a file a server holds, check says so and
// how to check it instead of timing out, and repair refuses to move it.
func TestStoreCommandOnALiveStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	st, err := session.OpenBoltStore(path) // the running server's hold on the file
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, cmd := range []string{"check", "repair"} {
		var out, errOut bytes.Buffer
		code := storeCommand([]string{cmd, path}, &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), "a running Parley holds it") || !strings.Contains(errOut.String(), "stop the server") {
			t.Fatalf("%s of a live store: exit %d, stdout %q, stderr %q", cmd, code, out.String(), errOut.String())
		}
	}
	if matches, _ := filepath.Glob(path + ".damaged-*"); len(matches) != 0 {
		t.Fatalf("repair moved a live store aside: %v", matches)
	}
}
