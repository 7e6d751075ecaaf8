package kvcache_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/llm/kvcache"
)

// diskOf is a pretend filesystem of total bytes holding everything under
// root (for Config.FreeBytes).
func diskOf(t *testing.T, root string, total int64) func(string) (int64, error) {
	return func(string) (int64, error) {
		var used int64
		err := filepath.Walk(root, func(_ string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				used += info.Size()
			}
			return nil
		})
		return total - used, err
	}
}

// waitDone waits until n saves have been written or given up.
func waitDone(t *testing.T, c *kvcache.Cache, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := c.Stats(); st.DiskWrites+st.DiskDropped+st.DiskFull+st.DiskWriteErrors < n; st = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want %d saves done", st, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The files leave the floor free: as the store beside them grows, the
// cache's own oldest files give way; once even none of them would leave
// room, states are not written (counted), and the store's file is never
// touched. A new Cache on a disk below the floor makes room at Open.
func TestFreeSpaceFloor(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "kvcache")
	store := filepath.Join(root, "sessions.db")
	if err := os.WriteFile(store, make([]byte, 10_000), 0o600); err != nil {
		t.Fatal(err)
	}
	const total, floor = 40_000, 15_000
	free := diskOf(t, root, total)
	cfg := kvcache.Config{Dir: dir, DiskBytes: 1 << 20, RAMBytes: 1 << 20, MinFreeBytes: floor, FreeBytes: free}
	c := open(t, cfg)
	for i := range 10 {
		c.Put(entry(fmt.Sprintf("s%d", i), 20)) // 2,000 bytes of state
		waitDone(t, c, int64(i+1))
		if f, _ := free(""); f < floor {
			t.Fatalf("after %d saves %d bytes free, under the %d floor", i+1, f, floor)
		}
	}
	st := c.Stats()
	if st.DiskEvictions == 0 || st.DiskFull != 0 || st.DiskEntries == 0 {
		t.Fatalf("stats %+v: want the oldest files evicted for room, every save written", st)
	}
	// The store grows to leave less than the floor even without the cache's files.
	if err := os.WriteFile(store, make([]byte, total-floor), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Put(entry("late", 20))
	waitDone(t, c, 11)
	st = c.Stats()
	if st.DiskFull != 1 || st.DiskEntries != 0 {
		t.Fatalf("stats %+v: want the save given up and every file of the cache removed", st)
	}
	if info, err := os.Stat(store); err != nil || info.Size() != total-floor {
		t.Fatalf("the store's file: %v, %v", info, err)
	}
	if _, err := c.Get("late"); err != nil {
		t.Fatalf("the state not written is still in RAM: %v", err)
	}
	c.Close()

	// A restart on a disk below the floor: the files found give way at Open.
	if err := os.WriteFile(store, make([]byte, 10_000), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20, RAMBytes: 1 << 20})
	for i := range 5 {
		c2.Put(entry(fmt.Sprintf("r%d", i), 20))
	}
	waitDone(t, c2, 5)
	c2.Close()
	before, _ := free("")
	c3 := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20, MinFreeBytes: before + 4_000, FreeBytes: free})
	if f, _ := free(""); f < before+4_000 || c3.Stats().DiskEntries >= 5 || c3.Stats().DiskEntries == 0 {
		t.Fatalf("at Open: %d bytes free (floor %d), %d files kept", f, before+4_000, c3.Stats().DiskEntries)
	}
}

// On a real filesystem that fills (a 256 KiB tmpfs; needs root), a write
// that fails with ENOSPC evicts the cache's oldest files and is written;
// the other file there is untouched.
func TestENOSPCEvictsOldest(t *testing.T) {
	root := t.TempDir()
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size=256k"); err != nil {
		t.Skipf("no tmpfs (%v): the floor test covers the rest", err)
	}
	t.Cleanup(func() { syscall.Unmount(root, 0) })
	other := bytes.Repeat([]byte("s"), 64<<10)
	if err := os.WriteFile(filepath.Join(root, "sessions.db"), other, 0o600); err != nil {
		t.Fatal(err)
	}
	c := open(t, kvcache.Config{Dir: filepath.Join(root, "kvcache"), DiskBytes: 1 << 30, RAMBytes: 1 << 30})
	const n = 12
	for i := range n {
		c.Put(entry(fmt.Sprintf("s%02d", i), 300)) // 30,000 bytes of state each: 6 fill the disk
		waitDone(t, c, int64(i+1))
	}
	st := c.Stats()
	t.Logf("%d saves: %d written, %d evicted, %d entries on disk", n, st.DiskWrites, st.DiskEvictions, st.DiskEntries)
	if st.DiskWrites != n || st.DiskWriteErrors != 0 || st.DiskEvictions == 0 {
		t.Fatalf("stats %+v: want every save written after evicting older files", st)
	}
	if _, err := c.Get(fmt.Sprintf("s%02d", n-1)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "sessions.db")); err != nil || !bytes.Equal(b, other) {
		t.Fatalf("the other file: %v", err)
	}
}

// At Open, files nobody used within MaxAge go, in every model's folder,
// and so does a folder left empty; recent files stay.
func TestPruneOldFiles(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"model-a", "model-b"} {
		c := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20, Identity: id})
		c.Put(entry("old", 10))
		c.Put(entry("new", 10))
		waitDone(t, c, 2)
		c.Close()
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*", "*.kv"))
	old := time.Now().Add(-48 * time.Hour)
	for _, p := range paths {
		if bytes.Contains(mustRead(t, p), []byte("old")) {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := open(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20, Identity: "model-a", MaxAge: 24 * time.Hour})
	if st := c.Stats(); st.Pruned != 2 || st.DiskEntries != 1 {
		t.Fatalf("stats %+v: want both old files pruned, model-a's new one kept", st)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*", "*.kv")); len(left) != 2 {
		t.Fatalf("files left %v, want the two new ones", left)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
