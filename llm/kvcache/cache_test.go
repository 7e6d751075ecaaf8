package kvcache_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/llm/kvcache"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func entry(key string, n int) *kvcache.Entry {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = i + 1
	}
	return &kvcache.Entry{Key: key, Tokens: toks, State: bytes.Repeat([]byte(key[:1]), n*100)}
}

func open(t *testing.T, cfg kvcache.Config) *kvcache.Cache {
	t.Helper()
	if cfg.Identity == "" {
		cfg.Identity = "model-a"
	}
	c, err := kvcache.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// waitWritten waits for the writer to have written n files in all.
func waitWritten(t *testing.T, c *kvcache.Cache, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // catches a hang only
	for c.Stats().DiskWrites+c.Stats().DiskDropped < n {
		if time.Now().After(deadline) {
			t.Fatalf("writes %+v, want %d", c.Stats(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func files(t *testing.T, dir string) (names []string, size int64) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Base(p))
		size += st.Size()
	}
	return names, size
}

// The RAM budget holds: the least recently used entries leave first, and
// an entry larger than the whole budget is not kept.
func TestRAMCapHolds(t *testing.T) {
	c := open(t, kvcache.Config{RAMBytes: 10_000})
	for i := range 10 {
		c.Put(entry(fmt.Sprintf("s%d", i), 20)) // 2,080 bytes each
		if st := c.Stats(); st.RAMBytes > 10_000 {
			t.Fatalf("after %d puts RAM holds %d bytes, over its 10,000", i+1, st.RAMBytes)
		}
		if i == 1 {
			if _, err := c.Get("s0"); err != nil { // s0 is now the most recently used
				t.Fatal(err)
			}
		}
	}
	st := c.Stats()
	if st.RAMEntries != 4 || st.RAMEvictions != 6 {
		t.Fatalf("entries %d, evictions %d; want 4 and 6", st.RAMEntries, st.RAMEvictions)
	}
	for _, k := range []string{"s6", "s7", "s8", "s9"} {
		if _, err := c.Get(k); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if _, err := c.Get("s0"); !errors.Is(err, kvcache.ErrNotFound) {
		t.Fatalf("s0: %v, want evicted", err)
	}
	c.Put(entry("big", 200))
	if _, err := c.Get("big"); !errors.Is(err, kvcache.ErrNotFound) || c.Stats().RAMBytes > 10_000 {
		t.Fatalf("an entry over the budget: %v, RAM %d bytes", err, c.Stats().RAMBytes)
	}
}

// The disk budget holds, files included, least recently used out first,
// and a key's newer state replaces its file.
func TestDiskCapHolds(t *testing.T) {
	dir := t.TempDir()
	c := open(t, kvcache.Config{Dir: dir, DiskBytes: 10_000})
	for i := range 8 {
		c.Put(entry(fmt.Sprintf("s%d", i), 20))
		waitWritten(t, c, int64(i+1))
		if _, size := files(t, dir); size > 10_000 {
			t.Fatalf("after %d puts the folder holds %d bytes, over its 10,000", i+1, size)
		}
	}
	c.Put(entry("s7", 30)) // a longer conversation: replaces s7's file
	waitWritten(t, c, 9)
	names, size := files(t, dir)
	st := c.Stats()
	if size > 10_000 || st.DiskBytes != size || len(names) != st.DiskEntries {
		t.Fatalf("folder %d bytes in %d files, index %d bytes in %d", size, len(names), st.DiskBytes, st.DiskEntries)
	}
	e, err := c.Get("s7")
	if err != nil || len(e.Tokens) != 30 {
		t.Fatalf("s7: %v, %d tokens", err, len(e.Tokens))
	}
	if _, err := c.Get("s0"); !errors.Is(err, kvcache.ErrNotFound) {
		t.Fatalf("s0: %v, want evicted", err)
	}
}

// A new Cache on the same folder finds the files (the newest per key),
// refuses those of another identity, and removes half-written ones.
func TestRestartFindsFiles(t *testing.T) {
	dir := t.TempDir()
	c := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20})
	want := entry("s1", 50)
	c.Put(want)
	waitWritten(t, c, 1)
	c.Close()
	sub, _ := filepath.Glob(filepath.Join(dir, "*"))
	if err := os.WriteFile(filepath.Join(sub[0], "tmp-1.part"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}

	c2 := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20})
	got, err := c2.Get("s1")
	if err != nil || !slices.Equal(got.Tokens, want.Tokens) || !bytes.Equal(got.State, want.State) {
		t.Fatalf("after a restart: %v", err)
	}
	if names, _ := files(t, dir); len(names) != 1 {
		t.Fatalf("files %v, want the one entry", names)
	}

	// Another identity has a folder of its own and sees nothing of this one.
	c3 := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20, Identity: "model-b"})
	if _, err := c3.Get("s1"); !errors.Is(err, kvcache.ErrNotFound) {
		t.Fatalf("another identity got %v", err)
	}
}

// Damaged files are refused, counted and removed, at the scan (a header
// that does not add up) or at the read (a checksum mismatch).
func TestDamagedFilesRefused(t *testing.T) {
	for name, spoil := range map[string]func([]byte) []byte{
		"truncated": func(b []byte) []byte { return b[:len(b)-7] },
		"flipped":   func(b []byte) []byte { b[len(b)/2] ^= 1; return b },
		"header":    func(b []byte) []byte { b[20] ^= 0xff; return b },
		"empty":     func([]byte) []byte { return nil },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			c := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20})
			c.Put(entry("s1", 50))
			waitWritten(t, c, 1)
			c.Close()
			paths, _ := filepath.Glob(filepath.Join(dir, "*", "*.kv"))
			b, _ := os.ReadFile(paths[0])
			if err := os.WriteFile(paths[0], spoil(b), 0o600); err != nil {
				t.Fatal(err)
			}
			c2 := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20})
			if _, err := c2.Get("s1"); err == nil {
				t.Fatal("a damaged file was returned")
			}
			if st := c2.Stats(); st.Corrupt+st.Foreign != 1 {
				t.Fatalf("stats %+v: want the file counted once", st)
			}
			if names, _ := files(t, dir); len(names) != 0 {
				t.Fatalf("files left: %v", names)
			}
		})
	}
}
