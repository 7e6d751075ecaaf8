package session_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// wantRetry checks err's code and that it says when to try again.
func wantRetry(tb testing.TB, err error, code string) time.Duration {
	tb.Helper()
	wantCode(tb, err, code)
	d := parley.RetryAfter(err)
	if d <= 0 {
		tb.Fatalf("%v: no RetryAfter", err)
	}
	return d
}

func owned(owner string) *session.Session {
	id, _ := session.NewID()
	return &session.Session{ID: id, Owner: owner, Messages: turnMsgs("hi", "hello")}
}

// TestStoreOwnerCap: a store holds at most WithMaxPerOwner sessions of one
// owner; past it a new one is refused (rate_limited, RetryAfter the
// owner's oldest session's expiry) and nothing is evicted, while other
// owners, updates and ownerless sessions go on. Deleting or expiring one
// of the owner's sessions makes room again.
func TestStoreOwnerCap(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now), session.WithMaxPerOwner(3), session.WithTTL(time.Hour), session.WithJanitorInterval(0))
			ctx := context.Background()
			victim := owned("10.0.0.2")
			mustPut(t, st, victim)
			var mine []*session.Session
			for range 3 {
				s := owned("10.0.0.1")
				mustPut(t, st, s)
				mine = append(mine, s)
				clk.Advance(time.Minute)
			}
			d := wantRetry(t, st.Put(ctx, owned("10.0.0.1")), parley.ERateLimited)
			if want := time.Hour - 3*time.Minute; d < want-time.Second || d > want+time.Second {
				t.Errorf("RetryAfter %v, want about %v (the oldest one's expiry)", d, want)
			}
			if st.Len() != 4 {
				t.Fatalf("store holds %d, want 4", st.Len())
			}
			mustPut(t, st, mine[0])           // an update is not a new session
			mustPut(t, st, owned("10.0.0.3")) // another owner
			mustPut(t, st, owned(""))         // no owner: not counted
			mustGet(t, st, victim.ID)
			if err := st.Delete(ctx, mine[1].ID); err != nil {
				t.Fatal(err)
			}
			mustPut(t, st, owned("10.0.0.1"))
			wantRetry(t, st.Put(ctx, owned("10.0.0.1")), parley.ERateLimited)
			// Expiry frees the owner's places too.
			clk.Advance(2 * time.Hour)
			if _, err := expire(ctx, st); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				mustPut(t, st, owned("10.0.0.1"))
			}
			wantRetry(t, st.Put(ctx, owned("10.0.0.1")), parley.ERateLimited)
		})
	}
}

// TestStoreEvictsOnlyPastTheFloor: a full store evicts the least recently
// updated session only when it has been idle past the floor; otherwise it
// refuses the new session (store_full, RetryAfter when the oldest crosses
// the floor) and every stored session stays.
func TestStoreEvictsOnlyPastTheFloor(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now), session.WithMaxSessions(3), session.WithEvictFloor(time.Hour), session.WithJanitorInterval(0))
			ctx := context.Background()
			var kept []*session.Session
			for i := range 3 {
				s := owned("10.0.0." + string(rune('2'+i)))
				mustPut(t, st, s)
				kept = append(kept, s)
				clk.Advance(time.Minute)
			}
			clk.Advance(10 * time.Minute)
			for range 5 {
				d := wantRetry(t, st.Put(ctx, owned("10.0.0.1")), parley.EStoreFull)
				if want := time.Hour - 13*time.Minute; d < want-time.Second || d > want+time.Second {
					t.Errorf("RetryAfter %v, want about %v", d, want)
				}
			}
			if err := st.Put(ctx, owned("10.0.0.1")); !strings.Contains(parley.ErrorMessage(err), "--max-sessions 3") {
				t.Errorf("the error does not name the limit: %q", parley.ErrorMessage(err))
			}
			for _, s := range kept {
				mustGet(t, st, s.ID)
			}
			// Writing to the oldest keeps it: the next oldest is the candidate.
			mustPut(t, st, kept[0])
			clk.Advance(time.Hour - 12*time.Minute + time.Second) // kept[1] is idle 1h+1s, kept[2] 59m+1s
			mustPut(t, st, owned("10.0.0.1"))
			if _, err := st.Get(ctx, kept[1].ID); !isNotFound(err) {
				t.Fatalf("the session idle past the floor was not evicted: %v", err)
			}
			mustGet(t, st, kept[0].ID)
			mustGet(t, st, kept[2].ID)
			wantRetry(t, st.Put(ctx, owned("10.0.0.1")), parley.EStoreFull)
		})
	}
}

// TestServiceCreationRate: one client creates at most n sessions a minute
// (WebSocket sessions, conversations, responses and forks together); the
// next is refused with RetryAfter, another client is not affected, and the
// bucket refills with time.
func TestServiceCreationRate(t *testing.T) {
	clk := newClock()
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, _ := newService(t, st, echo, session.WithClientLimits(6, 0), session.WithServiceClock(clk.Now))
	a := parley.Caller{Client: "10.0.0.1"}
	b := parley.Caller{Client: "10.0.0.2"}
	p := parley.DefaultParams()
	first := func() session.ResponseRecord {
		r, err := svc.Respond(context.Background(), a, session.ResponseRequest{Input: user("one"), Params: p})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, r.Turn)
		return r.Final()
	}()
	second, err := svc.Respond(context.Background(), a, session.ResponseRequest{Previous: first.ID, Input: user("two"), Params: p})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, second.Turn) // continues the session: not a creation
	fork, err := svc.Respond(context.Background(), a, session.ResponseRequest{Previous: first.ID, Input: user("three"), Params: p})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, fork.Turn) // an older response: a fork, a creation
	if _, err := svc.CreateConversation(context.Background(), a, "", nil, nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := svc.Open(context.Background(), a, ""); err != nil {
			t.Fatal(err)
		}
	}
	d := wantRetry(t, func() error { _, _, err := svc.Open(context.Background(), a, ""); return err }(), parley.ERateLimited)
	if d > 10*time.Second+time.Millisecond {
		t.Errorf("RetryAfter %v, want at most a tenth of a minute", d)
	}
	_, err = svc.CreateConversation(context.Background(), a, "", nil, nil)
	wantRetry(t, err, parley.ERateLimited)
	_, err = svc.Respond(context.Background(), a, session.ResponseRequest{Input: user("four"), Params: p})
	wantRetry(t, err, parley.ERateLimited)
	_, err = svc.Respond(context.Background(), a, session.ResponseRequest{Previous: first.ID, Input: user("five"), Params: p})
	wantRetry(t, err, parley.ERateLimited)
	// Continuing its newest response creates nothing, so it still works.
	cont, err := svc.Respond(context.Background(), a, session.ResponseRequest{Previous: second.Final().ID, Input: user("six"), Params: p})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, cont.Turn)
	if _, _, err := svc.Open(context.Background(), b, ""); err != nil {
		t.Fatalf("another client: %v", err)
	}
	clk.Advance(d)
	if _, _, err := svc.Open(context.Background(), a, ""); err != nil {
		t.Fatalf("after RetryAfter: %v", err)
	}
	// Every session records its creator; a fork by another client is that client's.
	bfork, err := svc.Respond(context.Background(), b, session.ResponseRequest{Previous: first.ID, Input: user("seven"), Params: p})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, bfork.Turn)
	_, fsess, err := svc.GetResponse(context.Background(), a, bfork.Final().ID)
	if err != nil || fsess.Owner != "10.0.0.2" {
		t.Fatalf("fork by another client: owner %q, %v", fsess.Owner, err)
	}
	_, osess, err := svc.GetResponse(context.Background(), a, first.ID)
	if err != nil || osess.Owner != "10.0.0.1" {
		t.Fatalf("first session: owner %q, %v", osess.Owner, err)
	}
}

// TestUnusedSessionsPerClient: sessions a client opened and never ran a
// turn on (a reset or a system prompt does not count) are kept up to the
// per-client bound; past it that client's oldest go, never another
// client's, and never a session with a turn.
func TestUnusedSessionsPerClient(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k)
			svc, _ := newService(t, st, echo, session.WithClientLimits(0, 4))
			a := parley.Caller{Client: "10.0.0.1"}
			b := parley.Caller{Client: "10.0.0.2"}
			other, _, err := svc.Open(context.Background(), b, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := svc.SetSystem(context.Background(), b, other.ID, "the other client's prompt"); err != nil {
				t.Fatal(err)
			}
			talked, _, err := svc.Open(context.Background(), a, "")
			if err != nil {
				t.Fatal(err)
			}
			tr, err := svc.Turn(context.Background(), a, talked.ID, "hello", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, tr)
			var silent []string
			for i := range 20 {
				s, _, err := svc.Open(context.Background(), a, "")
				if err != nil {
					t.Fatal(err)
				}
				silent = append(silent, s.ID)
				switch i % 3 { // edits that are not turns
				case 0:
					err = svc.Reset(context.Background(), a, s.ID)
				case 1:
					err = svc.SetSystem(context.Background(), a, s.ID, "system only")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := st.Len(); n != 4+2 {
				t.Fatalf("store holds %d sessions, want the client's 4 unused, its used one and the other client's", n)
			}
			for i, id := range silent {
				_, _, err := svc.Open(context.Background(), a, id)
				if kept := i >= len(silent)-4; kept != (err == nil) {
					t.Fatalf("unused session %d: kept %v, err %v", i, kept, err)
				}
			}
			if got, _, err := svc.Open(context.Background(), b, other.ID); err != nil || got.System != "the other client's prompt" {
				t.Fatalf("the other client's session: %+v, %v", got, err)
			}
			if got, _, err := svc.Open(context.Background(), a, talked.ID); err != nil || len(got.Messages) != 2 {
				t.Fatalf("the session with a turn: %+v, %v", got, err)
			}
		})
	}
}

// TestResponseIDsHideTheirSession: a response id does not contain its
// session id (nor does any part of it decode to it), yet it resolves,
// chains (the newest continues the session, an older one forks) and still
// resolves after the store is reopened; ids of the earlier form (session
// id + 12 hex digits) still work; altered ids find nothing.
func TestResponseIDsHideTheirSession(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			dir := t.TempDir()
			st := k.open(t, dir)
			svc, _ := newService(t, st, echo)
			ctx := context.Background()
			first := respond(t, svc, session.ResponseRequest{Input: user("one")})
			_, sess, err := svc.GetResponse(ctx, parley.Caller{}, first.ID)
			if err != nil {
				t.Fatal(err)
			}
			sid := sess.ID
			second := respond(t, svc, session.ResponseRequest{Previous: first.ID, Input: user("two")})
			for _, id := range []string{first.ID, second.ID} {
				if strings.Contains(id, sid) || strings.Contains(id, sid[:8]) {
					t.Fatalf("response id %q shows its session %q", id, sid)
				}
				if !strings.HasPrefix(id, session.ResponsePrefix) {
					t.Fatalf("response id %q", id)
				}
			}
			if first.ID[len(session.ResponsePrefix):][:11] == second.ID[len(session.ResponsePrefix):][:11] {
				t.Fatalf("two ids of one session share a prefix: %s %s", first.ID, second.ID)
			}
			_, s2, err := svc.GetResponse(ctx, parley.Caller{}, second.ID)
			if err != nil || s2.ID != sid {
				t.Fatalf("the newest response continued session %v, want %s (%v)", s2, sid, err)
			}
			fork := respond(t, svc, session.ResponseRequest{Previous: first.ID, Input: user("three")})
			if _, f, err := svc.GetResponse(ctx, parley.Caller{}, fork.ID); err != nil || f.ID == sid {
				t.Fatalf("an older response did not fork: %v", err)
			}
			// Tampering with an id finds nothing.
			raw := []byte(second.ID)
			raw[len(raw)-3] ^= 1
			if _, _, err := svc.GetResponse(ctx, parley.Caller{}, string(raw)); parley.ErrorCode(err) != parley.ENotFound {
				t.Fatalf("an altered id: %v", err)
			}
			// An id of the earlier form, as a session stored before the
			// change holds it.
			old := session.ResponsePrefix + sid + "0123456789ab"
			cur, err := svc.Conversation(ctx, parley.Caller{}, sid)
			if err != nil {
				t.Fatal(err)
			}
			rec := cur.Responses[len(cur.Responses)-1]
			cur.Responses[len(cur.Responses)-1].ID = old
			if err := st.Put(ctx, cur); err != nil {
				t.Fatal(err)
			}
			got, s3, err := svc.GetResponse(ctx, parley.Caller{}, old)
			if err != nil || s3.ID != sid || got.End != rec.End {
				t.Fatalf("old-format id: %+v, %v", got, err)
			}
			cont := respond(t, svc, session.ResponseRequest{Previous: old, Input: user("four")})
			if _, s4, err := svc.GetResponse(ctx, parley.Caller{}, cont.ID); err != nil || s4.ID != sid {
				t.Fatalf("chaining from an old-format id did not continue its session: %v", err)
			}
			if k.name == "bolt" { // the key is in the file: ids resolve after a restart
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
				st2 := k.open(t, dir)
				t.Cleanup(func() { st2.Close() })
				svc2, _ := newService(t, st2, echo)
				if _, s5, err := svc2.GetResponse(ctx, parley.Caller{}, cont.ID); err != nil || s5.ID != sid {
					t.Fatalf("after reopening %s: %v", filepath.Base(dir), err)
				}
			} else {
				st.Close()
			}
		})
	}
}

// TestRespondRefusedBeforeTheTurn: a new Responses session that the store
// would refuse (the client's cap, a full store) is refused before the
// engine is asked for a reply, not when the turn is committed.
func TestRespondRefusedBeforeTheTurn(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k, session.WithMaxPerOwner(1), session.WithMaxSessions(2), session.WithEvictFloor(time.Hour))
			svc, fake := newService(t, st, echo)
			calls := func() int { fake.mu.Lock(); defer fake.mu.Unlock(); return len(fake.calls) }
			a := parley.Caller{Client: "10.0.0.1"}
			b := parley.Caller{Client: "10.0.0.2"}
			c := parley.Caller{Client: "10.0.0.3"}
			p := parley.DefaultParams()
			r, err := svc.Respond(context.Background(), a, session.ResponseRequest{Input: user("one"), Params: p})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, r.Turn)
			r2, err := svc.Respond(context.Background(), a, session.ResponseRequest{Previous: r.Final().ID, Input: user("on"), Params: p})
			if err != nil { // continuing its own session creates nothing
				t.Fatal(err)
			}
			drain(t, r2.Turn)
			n := calls()
			_, err = svc.Respond(context.Background(), a, session.ResponseRequest{Input: user("two"), Params: p})
			wantRetry(t, err, parley.ERateLimited)
			_, err = svc.Respond(context.Background(), a, session.ResponseRequest{Previous: r.Final().ID, Input: user("fork"), Params: p})
			wantRetry(t, err, parley.ERateLimited) // a fork of the older response
			if calls() != n {
				t.Fatalf("the engine was asked %d times for refused sessions", calls()-n)
			}
			if _, err := svc.CreateConversation(context.Background(), b, "", nil, nil); err != nil {
				t.Fatal(err)
			}
			_, err = svc.Respond(context.Background(), c, session.ResponseRequest{Input: user("three"), Params: p})
			wantRetry(t, err, parley.EStoreFull)
			if calls() != n {
				t.Fatalf("the engine was asked for a session of a full store")
			}
		})
	}
}
