package session_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/session"
)

func usage(t *testing.T, st session.Store) session.Usage {
	t.Helper()
	u, ok := st.(session.UsageReporter)
	if !ok {
		t.Fatalf("%T does not report its usage", st)
	}
	return u.Usage()
}

func sizedSession(t *testing.T, n int) *session.Session {
	t.Helper()
	return &session.Session{ID: mustID(t), Messages: turnMsgs(strings.Repeat("u", n/2), strings.Repeat("a", n/2))}
}

// TestStoreByteBudget: on every store a write that would take the store
// past its budget is refused with store_full naming the budget; what was
// stored stays readable and unchanged; a write that shrinks a session is
// allowed even over the budget; deleting gives the bytes back.
func TestStoreByteBudget(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			const budget = 100_000
			st := mustOpen(t, k, session.WithMaxStoreBytes(budget), session.WithClientShare(0))
			ctx := context.Background()
			var kept []*session.Session
			var err error
			for range 20 {
				s := sizedSession(t, 20_000)
				if err = st.Put(ctx, s); err != nil {
					break
				}
				kept = append(kept, s)
			}
			if len(kept) != 4 {
				t.Fatalf("stored %d sessions of 20 kB under a 100 kB budget, want 4 (then %v)", len(kept), err)
			}
			wantCode(t, err, parley.EStoreFull)
			if !errors.Is(err, session.ErrStoreFull) || !strings.Contains(parley.ErrorMessage(err), "97.7 KiB") {
				t.Fatalf("refusal %q does not name the budget", parley.ErrorMessage(err))
			}
			u := usage(t, st)
			if u.Bytes > budget || u.Bytes < 4*20_000 || u.Budget != budget || u.RefusedBudget != 1 {
				t.Fatalf("usage %+v after 4 sessions of 20 kB and one refusal", u)
			}
			// Growing a stored session is refused too, and leaves it whole.
			grow := mustGet(t, st, kept[0].ID)
			grow.Messages = append(grow.Messages, turnMsgs(strings.Repeat("x", 25_000), "y")...)
			wantCode(t, st.Put(ctx, grow), parley.EStoreFull)
			if got := mustGet(t, st, kept[0].ID); len(got.Messages) != 2 {
				t.Fatalf("a refused write changed the session: %d messages", len(got.Messages))
			}
			// Shrinking is always allowed.
			shrink := mustGet(t, st, kept[1].ID)
			shrink.Messages = shrink.Messages[:0]
			mustPut(t, st, shrink)
			if after := usage(t, st); after.Bytes >= u.Bytes-15_000 {
				t.Fatalf("emptying a session of 20 kB: %d bytes -> %d", u.Bytes, after.Bytes)
			}
			// Deleting gives the bytes back: now a new one fits.
			if err := st.Delete(ctx, kept[2].ID); err != nil {
				t.Fatal(err)
			}
			mustPut(t, st, sizedSession(t, 20_000))
			for _, s := range kept[3:] {
				mustGet(t, st, s.ID)
			}
		})
	}
}

// ownedSized is sizedSession owned by the client owner.
func ownedSized(t *testing.T, n int, owner string) *session.Session {
	t.Helper()
	s := sizedSession(t, n)
	s.Owner = owner
	return s
}

// TestStoreClientShare: one owner (Session.Owner, a client key) may hold
// only its share of the budget; another owner still has room; sessions
// without an owner count only against the budget; a write by another
// client to the first client's session counts against its owner, the
// record's.
func TestStoreClientShare(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k, session.WithMaxStoreBytes(1_000_000), session.WithClientShare(0.1))
			ctx := context.Background()
			bob := ctx // another client writes: the store reads owners from records, not from the writer
			n := 0
			var err error
			var first *session.Session
			for range 50 {
				s := ownedSized(t, 20_000, "192.0.2.1")
				if err = st.Put(ctx, s); err != nil {
					break
				}
				if first == nil {
					first = s
				}
				n++
			}
			if n != 4 {
				t.Fatalf("one client stored %d sessions of 20 kB with a 100 kB share, want 4 (then %v)", n, err)
			}
			wantCode(t, err, parley.EStoreFull)
			if !strings.Contains(parley.ErrorMessage(err), "one client may hold") {
				t.Fatalf("refusal %q does not say it is the client's share", parley.ErrorMessage(err))
			}
			rep := st.(session.UsageReporter)
			if held := rep.ClientBytes("192.0.2.1"); held < 80_000 || held > 100_000 {
				t.Fatalf("ClientBytes = %d, want about 80 kB", held)
			}
			if u := rep.Usage(); u.RefusedShare != 1 || u.ClientShare != 100_000 {
				t.Fatalf("usage %+v", u)
			}
			mustPut(t, st, func() *session.Session { s := sizedSession(t, 20_000); return s }()) // no client: the budget only
			if err := st.Put(bob, ownedSized(t, 20_000, "192.0.2.2")); err != nil {
				t.Fatalf("another client is refused: %v", err)
			}
			// Bob growing Alice's session is charged to Alice.
			grown := mustGet(t, st, first.ID)
			grown.Messages = append(grown.Messages, turnMsgs(strings.Repeat("x", 20_000), "y")...)
			wantCode(t, st.Put(bob, grown), parley.EStoreFull)
		})
	}
}

// TestForkAmplification: a 100-byte request that forks a large
// conversation (previous_response_id naming an older turn) stores a full
// copy of its history, and that copy counts against the client that forks:
// after a few forks its share is spent and the next fork is refused with
// store_full, while the store stays far below its budget.
func TestForkAmplification(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k, session.WithMaxStoreBytes(10<<20), session.WithClientShare(0.05))
			svc, _ := newService(t, st, echo)
			owner := parley.Caller{Client: "198.51.100.7"}
			attacker := parley.Caller{Client: "203.0.113.9"}
			big := strings.Repeat("Lily had a red ball. ", 5000) // about 100 kB
			r, err := svc.Respond(context.Background(), owner, session.ResponseRequest{Input: user(big), Params: parley.DefaultParams()})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, r.Turn)
			older := r.Final()
			r, err = svc.Respond(context.Background(), owner, session.ResponseRequest{Previous: older.ID, Input: user("and then?"), Params: parley.DefaultParams()})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, r.Turn)
			before := usage(t, st).Bytes
			forks := 0
			var last error
			for range 30 {
				f, err := svc.Respond(context.Background(), attacker, session.ResponseRequest{Previous: older.ID, Input: user("fork"), Params: parley.DefaultParams()})
				if err != nil {
					last = err
					break
				}
				drain(t, f.Turn)
				if !f.Committed() {
					last = errors.New("not committed")
					break
				}
				forks++
			}
			u := usage(t, st)
			share := u.ClientShare
			t.Logf("%s: %d forks of a %d-byte conversation stored before the refusal; store %d -> %d bytes (share %d)", k.name, forks, before, before, u.Bytes, share)
			if forks == 0 || forks > int(share)/100_000 {
				t.Fatalf("%d forks of a 100 kB conversation fit a %d-byte share", forks, share)
			}
			held := st.(session.UsageReporter).ClientBytes("203.0.113.9")
			if held < int64(forks)*100_000 || held > share {
				t.Fatalf("the forks count %d bytes against their client, want each fork's full size (%d forks)", held, forks)
			}
			if u.RefusedShare == 0 {
				t.Fatalf("the fork past the share was not refused by it: %v, %+v", last, u)
			}
			// The owner's conversation is untouched and still growable.
			r, err = svc.Respond(context.Background(), owner, session.ResponseRequest{Previous: r.Final().ID, Input: user("more"), Params: parley.DefaultParams()})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, r.Turn)
			if !r.Committed() {
				t.Fatal("the owner could not continue its conversation")
			}
		})
	}
}

// TestBoltCompactsOnOpen: the disk of deleted sessions comes back when the
// store opens again (bbolt alone never shrinks its file), and the copy
// keeps every bucket: the response ids' key (meta), so ids issued before
// still resolve, and the owners, so a client's sessions and bytes still
// count against it.
func TestBoltCompactsOnOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	capped := []session.StoreOption{session.WithMaxPerOwner(1), session.WithMaxStoreBytes(10 << 20), session.WithClientShare(0.5)}
	st := openBolt(t, path, capped...)
	ctx := context.Background()
	idKey, err := st.IDKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 40 {
		s := sizedSession(t, 100_000)
		if i == 0 {
			s.Owner = "192.0.2.1"
		}
		mustPut(t, st, s)
		ids = append(ids, s.ID)
	}
	keep := ids[0]
	for _, id := range ids[1:] {
		if err := st.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	before := fileSize(t, path)
	st = openBolt(t, path, capped...)
	after := fileSize(t, path)
	t.Logf("40 sessions of 100 kB, 39 deleted: file %d -> %d bytes on reopen", before, after)
	if after > before/4 || before < 4<<20 {
		t.Fatalf("the file did not shrink: %d -> %d bytes", before, after)
	}
	if got := mustGet(t, st, keep); len(got.Messages) != 2 {
		t.Fatalf("the kept session after compaction: %+v", got.Messages)
	}
	if u := usage(t, st); u.Bytes < 100_000 || u.Bytes > 110_000 {
		t.Fatalf("usage after reopen: %+v", u)
	}
	if k, err := st.IDKey(ctx); err != nil || string(k) != string(idKey) {
		t.Fatalf("the response id key changed in the compaction (%v): response ids issued before no longer resolve", err)
	}
	if held := st.ClientBytes("192.0.2.1"); held < 100_000 {
		t.Fatalf("the owner's bytes after compaction: %d", held)
	}
	wantRetry(t, st.Put(ctx, owned("192.0.2.1")), parley.ERateLimited) // its one session still counts
	st.Close()
	if err := session.CheckBoltFile(path); err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestBoltDiskFull: on a real small file system (a 2 MiB tmpfs; root only,
// skipped otherwise) a write that does not fit answers store_full, not
// internal; every session written before reads back whole; the store keeps
// serving reads and, once the disk has room again, writes.
func TestBoltDiskFull(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	// Something else on the disk, removed later to make room.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 512<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	st := openBolt(t, filepath.Join(dir, "sessions.db"), session.WithMaxStoreBytes(0))
	defer st.Close()
	ctx := context.Background()
	var acked []*session.Session
	var err error
	for i := range 200 {
		s := sizedSession(t, 30_000)
		s.System = fmt.Sprint("session ", i)
		if err = st.Put(ctx, s); err != nil {
			break
		}
		acked = append(acked, s)
	}
	if err == nil {
		t.Fatal("200 sessions of 30 kB fit a 2 MiB file system")
	}
	wantCode(t, err, parley.EStoreFull)
	if !errors.Is(err, session.ErrStoreFull) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("the refusal does not keep its cause: %v", err)
	}
	t.Logf("%d sessions acknowledged before the disk filled: %v", len(acked), err)
	for _, s := range acked {
		if got := mustGet(t, st, s.ID); got.System != s.System || len(got.Messages) != 2 {
			t.Fatalf("an acknowledged session changed: %q", got.System)
		}
	}
	if u := usage(t, st); u.RefusedDisk == 0 {
		t.Fatalf("usage %+v: the disk refusal is not counted", u)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustPut(t, st, sizedSession(t, 30_000))
	for _, s := range acked {
		mustGet(t, st, s.ID)
	}
}

// TestRedisFull: Redis at its maxmemory refuses writes (OOM); the store
// answers store_full, not unavailable or internal, and reads keep working.
func TestRedisFull(t *testing.T) {
	srv := redistest.Start(t)
	st := openRedis(t, srv, session.WithMaxStoreBytes(0))
	ctx := context.Background()
	kept := sizedSession(t, 10_000)
	mustPut(t, st, kept)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	used, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var now int64
	for _, line := range strings.Split(used, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			fmt.Sscan(v, &now)
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", fmt.Sprint(now+200_000)).Err(); err != nil {
		t.Fatal(err)
	}
	var perr error
	for range 100 {
		if perr = st.Put(ctx, sizedSession(t, 20_000)); perr != nil {
			break
		}
	}
	wantCode(t, perr, parley.EStoreFull)
	if !errors.Is(perr, session.ErrStoreFull) || st.Usage().RefusedDisk != 1 {
		t.Fatalf("Redis at maxmemory: %v, %+v", perr, st.Usage())
	}
	if got := mustGet(t, st, kept.ID); len(got.Messages) != 2 {
		t.Fatalf("read at maxmemory: %+v", got)
	}
}

// TestTurnRefusedUpFront: once a client's share is spent, its next turn is
// refused with store_full before a reply is generated (the responder is
// not called), on the chat and the Responses API alike; another client's
// turn runs.
func TestTurnRefusedUpFront(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k, session.WithMaxStoreBytes(1_000_000), session.WithClientShare(0.05))
			svc, f := newService(t, st, echo)
			alice := parley.Caller{Client: "192.0.2.1"}
			var err error
			var last *session.Session
			for range 10 {
				var c *session.Session
				if c, err = svc.CreateConversation(context.Background(), alice, "", turnMsgs(strings.Repeat("x", 20_000)), nil); err != nil {
					break
				}
				last = c
			}
			wantCode(t, err, parley.EStoreFull)
			calls := len(f.callList())
			_, err = svc.Turn(context.Background(), alice, last.ID, strings.Repeat("y", 15_000), parley.Params{})
			wantCode(t, err, parley.EStoreFull)
			_, err = svc.Respond(context.Background(), alice, session.ResponseRequest{Conversation: last.ID, Input: user(strings.Repeat("y", 15_000)), Params: parley.DefaultParams()})
			wantCode(t, err, parley.EStoreFull)
			if n := len(f.callList()); n != calls {
				t.Fatalf("the responder was called %d times for refused turns", n-calls)
			}
			bob := parley.Caller{Client: "192.0.2.2"}
			r, err := svc.Respond(context.Background(), bob, session.ResponseRequest{Input: user("hello"), Params: parley.DefaultParams()})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, r.Turn)
		})
	}
}

// TestRedisOwnerBytes: the Redis store charges a record's owner (its field
// o) even when the accounting did not see it written: sessions stored before
// the byte budget existed are charged to their owners when a store opens,
// and a session whose key Redis expired by itself (its fields gone) still
// leaves its owner's count when the janitor sweeps it.
func TestRedisOwnerBytes(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	clk := newClock()
	opts := []session.StoreOption{session.WithClock(clk.Now), session.WithTTL(time.Hour), session.WithJanitorInterval(0)}
	st := openRedis(t, srv, opts...)
	const owner = "2001:db8:1:2::/64"
	a, b := ownedSized(t, 20_000, owner), ownedSized(t, 20_000, owner)
	mustPut(t, st, a)
	mustPut(t, st, b)
	held := st.ClientBytes(owner)
	if held < 40_000 {
		t.Fatalf("the owner holds %d bytes after two sessions of 20 kB", held)
	}
	st.Close()

	// The accounting of a version before the budget: none.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if err := rdb.Del(ctx, "test:bytes", "test:sz", "test:ow", "test:ob").Err(); err != nil {
		t.Fatal(err)
	}
	st = openRedis(t, srv, opts...)
	if got := st.ClientBytes(owner); got != held {
		t.Fatalf("after counting the stored sessions at open the owner holds %d bytes, want %d", got, held)
	}

	// Redis expires a key by itself: the record and its owner field go.
	if err := rdb.Del(ctx, "test:s:"+a.ID).Err(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Hour)
	if _, err := st.Expire(ctx); err != nil {
		t.Fatal(err)
	}
	if got, u := st.ClientBytes(owner), st.Usage(); got != 0 || u.Bytes != 0 {
		t.Fatalf("after the sweep the owner holds %d bytes, the store %d", got, u.Bytes)
	}
}
