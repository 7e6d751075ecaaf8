package kvcache_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/parley-chat/parley/llm/kvcache"
	"github.com/parley-chat/parley/llm/kvcache/kvcachetest"
)

func openDirTiers(t *testing.T, budget int64) (kvcache.Tier, kvcache.Tier) {
	t.Helper()
	dir := t.TempDir()
	a, err := kvcache.OpenDirTier(dir, budget, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvcache.OpenDirTier(dir, budget, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestDirTier(t *testing.T) { kvcachetest.TestTier(t, openDirTiers) }

// A file copied over another key's, or cut short, is refused and removed.
func TestDirTierRefusesForeignAndCorruptFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	d, err := kvcache.OpenDirTier(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"userA:s1", "userB:s1"} {
		if _, err := d.Put(ctx, "id-a", kvcachetest.Entry(k, 50, k[4])); err != nil {
			t.Fatal(err)
		}
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*", "*.kv"))
	if len(paths) != 2 {
		t.Fatalf("files %v", paths)
	}
	var aData, bData []byte
	var bPath string
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kvcache.Decode(data, "id-a", "userA:s1"); err == nil {
			aData = data
		} else {
			bData, bPath = data, p
		}
	}
	if aData == nil || bData == nil {
		t.Fatal("userA's file not found")
	}
	// userB's file cut short: corrupt.
	if err := os.WriteFile(bPath, bData[:len(bData)-10], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, "id-a", "userB:s1"); !errors.Is(err, kvcache.ErrCorrupt) {
		t.Fatalf("a truncated file: %v, want ErrCorrupt", err)
	}
	if _, err := os.Stat(bPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the corrupt file stayed: %v", err)
	}
	// userA's file copied over userB's: a state of another user.
	if err := os.WriteFile(bPath, aData, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, "id-a", "userB:s1"); !errors.Is(err, kvcache.ErrForeign) {
		t.Fatalf("another user's state: %v, want ErrForeign", err)
	}
	if _, err := os.Stat(bPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the foreign file stayed: %v", err)
	}
	if _, err := d.Get(ctx, "id-a", "userA:s1"); err != nil {
		t.Fatalf("userA's own state: %v", err)
	}
}
