package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testbin"
)

// respondStatus posts a new conversation's first response and returns the
// HTTP status (and the body when it is not 200).
func respondStatus(t *testing.T, addr, input string) (int, string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"input": input, "max_output_tokens": 4})
	res, err := http.Post("http://"+addr+"/v1/responses", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusOK {
		raw = nil
	}
	return res.StatusCode, string(raw)
}

func freeOn(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// waitKVSettled waits until no saved state is waiting for the disk.
func waitKVSettled(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for metric(t, addr, "parley_kv_unsaved_slots") > 0 || metric(t, addr, "parley_kv_disk_pending") > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the KV states did not settle")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The fill on a data folder of 8 MiB (a tmpfs; needs root):
// conversations of ~1,800 tokens, each of whose KV state (about a MiB) goes
// to the disk tier, then shorter ones, used to fill the disk, and from then on every write of
// the session store was refused (507 store_full), across restarts. The KV
// files now leave the store's budget and a margin free (by default: here
// nothing is written, the states stay in RAM), and with a floor set lower
// they use what lies above it, their own oldest giving way; the store's
// writes work throughout and after a restart.
func TestKVDiskLeavesTheStoreRoom(t *testing.T) {
	bin := testbin.Parley(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("no tmpfs (%v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	// Conversations of about 1,800 tokens, then of about 260 and 30 that
	// fill what room the long ones leave.
	long := func(i int) string {
		n := 85
		switch {
		case i%100 >= 18:
			n = 1
		case i%100 >= 10:
			n = 12
		}
		return fmt.Sprintf("Story %d. ", i) + strings.Repeat("Lily saw a big red ball and a small dog in the park. ", n)
	}
	args := []string{"--store", "bolt", "--data-dir", dir, "--ctx", "2048", "--max-store-bytes", "1048576",
		"--session-creates-per-minute", "0", "--max-prompt-tokens", "-1"}
	fill := func(s *server, from, n int) (refused int) {
		for i := from; i < from+n; i++ {
			if code, body := respondStatus(t, s.addr, long(i)); code != http.StatusOK {
				if refused++; refused <= 3 {
					t.Logf("conversation %d: %d %s", i, code, body)
				}
			}
		}
		waitKVSettled(t, s.addr)
		return refused
	}
	small := func(s *server, what string) {
		t.Helper()
		for i := range 3 {
			if code, body := respondStatus(t, s.addr, fmt.Sprintf("Hello %d.", i)); code != http.StatusOK {
				t.Fatalf("%s: a new 10-byte conversation got %d %s", what, code, body)
			}
		}
	}

	s := start(t, bin, args...)
	free0 := freeOn(t, dir)
	refused := fill(s, 0, 28)
	t.Logf("defaults: 28 conversations, %d refused; %d KV files (%.1f MiB), %.1f of %.1f MiB free", refused,
		int(metric(t, s.addr, "parley_kv_disk_entries")), metric(t, s.addr, "parley_kv_disk_bytes")/(1<<20),
		float64(freeOn(t, dir))/(1<<20), float64(free0)/(1<<20))
	if refused > 0 {
		t.Fatalf("%d of 28 conversations refused", refused)
	}
	small(s, "after the fill")
	if full := metric(t, s.addr, "parley_kv_disk_full_total"); full < 1 || metric(t, s.addr, "parley_kv_disk_entries") != 0 {
		t.Fatalf("with the default floor (the store's 1 MiB budget + 64 MiB) on an 8 MiB disk: %v states kept from the disk, %v files",
			full, metric(t, s.addr, "parley_kv_disk_entries"))
	}
	s.Kill()

	// A floor of 4 MiB: the states use the disk above it.
	const floor = 4 << 20
	s = start(t, bin, append(args, "--kv-cache-min-free", "4MiB")...)
	small(s, "after a restart")
	refused = fill(s, 100, 6)
	free := freeOn(t, dir)
	t.Logf("floor 4 MiB: 6 conversations, %d refused; %d KV files kept (%.1f MiB) of %v written; %.1f MiB free", refused,
		int(metric(t, s.addr, "parley_kv_disk_entries")), metric(t, s.addr, "parley_kv_disk_bytes")/(1<<20),
		metric(t, s.addr, "parley_kv_disk_writes_total"), float64(free)/(1<<20))
	if refused > 0 {
		t.Fatalf("%d of 6 conversations refused", refused)
	}
	if metric(t, s.addr, "parley_kv_disk_entries") < 1 || metric(t, s.addr, "parley_kv_disk_writes_total") <= metric(t, s.addr, "parley_kv_disk_entries") {
		t.Fatal("the states did not use the disk above the floor, or none gave way")
	}
	if free < floor-(1<<20) {
		t.Fatalf("%d bytes free: the KV files took the store's room (floor %d)", free, floor)
	}
	small(s, "with the KV files at the floor")
	s.Kill()
	s = start(t, bin, append(args, "--kv-cache-min-free", "4MiB")...)
	small(s, "after a second restart")
}
