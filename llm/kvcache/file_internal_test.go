package kvcache

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzReadFile: whatever a file holds, reading it never panics, and a file
// that passes every check reads back what was written.
func FuzzReadFile(f *testing.F) {
	dir := f.TempDir()
	if _, err := writeFile(dir, "seed.kv", header{identity: "id", key: "k", tokens: []int{1, 2, 3}}, []byte("state")); err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(filepath.Join(dir, "seed.kv"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "f.kv")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		readFileHeader(path)
		h, state, err := readFile(path, "id")
		if err != nil {
			return
		}
		again := filepath.Join(t.TempDir(), "g.kv")
		if _, err := writeFile(filepath.Dir(again), "g.kv", header{identity: h.identity, key: h.key, tokens: h.tokens}, state); err != nil {
			t.Fatal(err)
		}
		h2, state2, err := readFile(again, "id")
		if err != nil || h2.key != h.key || !slices.Equal(h2.tokens, h.tokens) || !bytes.Equal(state, state2) {
			t.Fatalf("a file that passed its checks does not round-trip: %v", err)
		}
	})
}
