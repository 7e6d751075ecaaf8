package session_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/session"
)

const boltPage = 4096 // bbolt's page size on this platform's usual 4 KiB pages

// TestBoltEmptyFileIsAnError: a 0-byte file where the store should be is
// damage, not a new store.
func TestBoltEmptyFileIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := session.OpenBoltStore(path)
	if !errors.Is(err, session.ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "store repair") {
		t.Fatalf("want a damaged-store error naming the file and the repair, got %v", err)
	}
	if err := session.CheckBoltFile(path); !errors.Is(err, session.ErrDamaged) {
		t.Fatalf("check: %v", err)
	}
	moved, kept, err := session.RepairBoltFile(path)
	if err != nil || kept != 0 {
		t.Fatalf("repair: %v (kept %d)", err, kept)
	}
	if _, err := os.Stat(moved); err != nil {
		t.Fatalf("the old file was not kept aside: %v", err)
	}
	openBolt(t, path).Close()
}

// TestBoltCorruptPages: whatever page of a store is overwritten with
// garbage, opening it returns an error naming the file (never a panic) or
// a store that works, and repair yields a store that opens, keeping what
// can be read.
func TestBoltCorruptPages(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	st := openBolt(t, good)
	const n = 60
	for range n {
		mustPut(t, st, bigSession(t))
	}
	st.Close()
	if err := session.CheckBoltFile(good); err != nil {
		t.Fatalf("check of a sound file: %v", err)
	}
	orig, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	pages := len(orig) / boltPage
	damagedSeen := 0
	for pg := 0; pg < pages; pg++ {
		for _, fill := range []byte{0x00, 0x5a} {
			b := append([]byte(nil), orig...)
			for i := pg * boltPage; i < (pg+1)*boltPage; i++ {
				b[i] = fill ^ byte(i*7)
			}
			path := filepath.Join(dir, "bad.db")
			os.Remove(path)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := session.OpenBoltStore(path)
			if err == nil {
				st.Close()
				continue
			}
			damagedSeen++
			if !errors.Is(err, session.ErrDamaged) || !strings.Contains(err.Error(), path) {
				t.Fatalf("page %d: want a damaged-store error naming the file, got %v", pg, err)
			}
			_, kept, err := session.RepairBoltFile(path)
			if err != nil {
				t.Fatalf("page %d: repair: %v", pg, err)
			}
			if kept > n {
				t.Fatalf("page %d: kept %d of %d", pg, kept, n)
			}
			re := openBolt(t, path)
			if re.Len() != kept {
				t.Fatalf("page %d: repaired store holds %d, repair said %d", pg, re.Len(), kept)
			}
			re.Close()
		}
	}
	if damagedSeen == 0 {
		t.Fatal("no corruption was detected at all")
	}
}

func bigSession(t *testing.T) *session.Session {
	s := &session.Session{ID: mustID(t), System: strings.Repeat("s", 300), Messages: turnMsgs(strings.Repeat("q", 200), strings.Repeat("a", 400))}
	return s
}
