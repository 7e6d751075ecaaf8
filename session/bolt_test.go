package session_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

func openBolt(tb testing.TB, path string, opts ...session.StoreOption) *session.BoltStore {
	tb.Helper()
	st, err := session.OpenBoltStore(path, opts...)
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	return st
}

func TestBoltPersistsAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nested", "dir", "sessions.db") // the directory is created
	clk := newClock()
	st := openBolt(t, path, session.WithClock(clk.Now), session.WithTTL(time.Hour))
	p := parley.DefaultParams()
	p.Stop = []string{"\nUser:"}
	live := &session.Session{ID: mustID(t), System: "sys", Messages: turnMsgs("one", "two"), Params: &p}
	gone := &session.Session{ID: mustID(t)}
	deleted := &session.Session{ID: mustID(t)}
	mustPut(t, st, gone)
	clk.Advance(30 * time.Minute)
	mustPut(t, st, live)
	mustPut(t, st, deleted)
	if err := st.Delete(context.Background(), deleted.ID); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	clk.Advance(31 * time.Minute) // gone is now idle for 61 minutes, live for 31
	st = openBolt(t, path, session.WithClock(clk.Now), session.WithTTL(time.Hour), session.WithJanitorInterval(0))
	defer st.Close()
	if st.Len() != 2 {
		t.Fatalf("Len after reopen = %d, want 2", st.Len())
	}
	got := mustGet(t, st, live.ID)
	if !reflect.DeepEqual(got, live) {
		t.Fatalf("after reopen: %+v\nwant %+v", got, live)
	}
	_, err := st.Get(context.Background(), gone.ID)
	wantCode(t, err, parley.ENotFound)
	_, err = st.Get(context.Background(), deleted.ID)
	wantCode(t, err, parley.ENotFound)
	if n, err := st.Expire(context.Background()); n != 1 || err != nil {
		t.Fatalf("Expire after reopen = %d, %v; want 1, nil", n, err)
	}
	if st.Len() != 1 {
		t.Fatalf("Len = %d, want 1", st.Len())
	}
}

func TestBoltRefusesASecondOpener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	st := openBolt(t, path)
	defer st.Close()
	start := time.Now()
	if _, err := session.OpenBoltStore(path); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second open of a locked file: err = %v, want a 'locked' error", err)
	}
	// Refused after the lock's own wait (2 s); the bound only catches a
	// second opener that waits for ever.
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("second open took %v", d)
	}
}

// killHelperEnv names the file the helper process writes to; when it is
// set, TestBoltKillHelper is the child of TestBoltSurvivesKill.
const killHelperEnv = "PARLEY_SESSION_KILL_HELPER_DB"

// TestBoltSurvivesKill starts a child process that keeps committing turns,
// kills it with SIGKILL mid-stream, and checks that the file opens and
// holds every turn the child reported as committed (Put had returned).
func TestBoltSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), "sessions.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestBoltKillHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), killHelperEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	committed := make(map[string]int) // id -> messages it held at its last reported commit
	sc := bufio.NewScanner(out)
	for lines := 0; lines < 60 && sc.Scan(); {
		var id string
		var n int
		if _, err := fmt.Sscanf(sc.Text(), "committed %s %d", &id, &n); err != nil {
			continue // test framework chatter
		}
		committed[id] = n
		lines++
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // "signal: killed" is the point
	if len(committed) == 0 {
		t.Fatal("the helper reported no commits")
	}

	st := openBolt(t, path, session.WithJanitorInterval(0))
	defer st.Close()
	for id, n := range committed {
		s := mustGet(t, st, id)
		// A later Put may have committed without being reported: at least n.
		if len(s.Messages) < n {
			t.Errorf("session %s has %d messages after kill -9, %d were committed", id, len(s.Messages), n)
		}
		for i, m := range s.Messages {
			if want := fmt.Sprintf("turn %d", i/2); m.Content != want {
				t.Errorf("session %s message %d = %q, want %q", id, i, m.Content, want)
			}
		}
	}
	// The file is still writable.
	mustPut(t, st, &session.Session{ID: mustID(t)})
}

// TestBoltKillHelper is the child process of TestBoltSurvivesKill; it does
// nothing in a normal run.
func TestBoltKillHelper(t *testing.T) {
	path := os.Getenv(killHelperEnv)
	if path == "" {
		t.Skip("helper process for TestBoltSurvivesKill")
	}
	st, err := session.OpenBoltStore(path)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	ids := []string{mustID(t), mustID(t), mustID(t)}
	sessions := make(map[string]*session.Session)
	// Commit turns until the parent kills this process (bounded in case it does not).
	for i := 0; i < 100000; i++ {
		id := ids[i%len(ids)]
		s := sessions[id]
		if s == nil {
			s = &session.Session{ID: id}
			sessions[id] = s
		}
		turn := fmt.Sprintf("turn %d", len(s.Messages)/2)
		s.Messages = append(s.Messages, turnMsgs(turn, turn)...)
		if err := st.Put(context.Background(), s); err != nil {
			fmt.Println("put:", err)
			os.Exit(2)
		}
		fmt.Printf("committed %s %d\n", id, len(s.Messages))
	}
	os.Exit(3)
}
