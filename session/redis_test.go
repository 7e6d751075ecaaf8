package session_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/session"
)

func openRedis(t *testing.T, srv *redistest.Server, opts ...session.StoreOption) *session.RedisStore {
	t.Helper()
	st, err := session.OpenRedisStore(context.Background(), srv.URL(0), "test:", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// cachedEcho is echo with an engine that reports a reused prompt prefix.
func cachedEcho(ctx context.Context, c call, r *fakeReply) {
	last := c.msgs[len(c.msgs)-1].Content
	r.token(ctx, "reply to "+last)
	r.ch <- parley.Event{Done: true, Finish: parley.FinishEOS, Usage: parley.Usage{PromptTokens: 10, CachedPromptTokens: 6}}
	close(r.ch)
}

// TestRedisReplicasShareSession: two services, each with its own store
// client (two replicas), run turns on one session at the same time. Every
// turn is stored exactly once, each prompt followed by its own reply.
func TestRedisReplicasShareSession(t *testing.T) {
	srv := redistest.Start(t)
	svcA, _ := newService(t, openRedis(t, srv), echo)
	svcB, _ := newService(t, openRedis(t, srv), echo)
	id := mustOpenSession(t, svcA).ID
	const turns = 15
	var wg sync.WaitGroup
	errs := make(chan error, 2*turns)
	for name, svc := range map[string]*session.Service{"a": svcA, "b": svcB} {
		wg.Go(func() {
			for i := range turns {
				tr, err := svc.Turn(context.Background(), parley.Caller{}, id, fmt.Sprintf("%s%d", name, i), parley.Params{})
				if err != nil {
					errs <- err
					return
				}
				for ev := range tr.Events() {
					if ev.Done && ev.Finish == parley.FinishError {
						errs <- ev.Err
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, _, err := svcB.Open(context.Background(), parley.Caller{}, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != 4*turns {
		t.Fatalf("stored %d messages, want %d: %v", len(got.Messages), 4*turns, got.Messages)
	}
	seen := map[string]bool{}
	for i := 0; i < len(got.Messages); i += 2 {
		u, a := got.Messages[i], got.Messages[i+1]
		if u.Role != parley.RoleUser || a.Content != "reply to "+u.Content || seen[u.Content] {
			t.Fatalf("turn %d is %v, %v (seen before: %v)", i/2, u, a, seen[u.Content])
		}
		seen[u.Content] = true
	}
}

// TestRedisKVCacheState: a turn continuing this replica's own commit is
// warm; one resuming another replica's is rebuilt; the first is new.
func TestRedisKVCacheState(t *testing.T) {
	srv := redistest.Start(t)
	svcA, _ := newService(t, openRedis(t, srv), cachedEcho)
	svcB, _ := newService(t, openRedis(t, srv), cachedEcho)
	id := mustOpenSession(t, svcA).ID
	turn := func(svc *session.Service) string {
		t.Helper()
		tr, err := svc.Turn(context.Background(), parley.Caller{}, id, "hi", parley.Params{})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, tr)
		return tr.KVCache()
	}
	for i, tc := range []struct {
		svc  *session.Service
		want string
	}{{svcA, session.KVNew}, {svcA, session.KVWarm}, {svcB, session.KVRebuilt}, {svcB, session.KVWarm}, {svcA, session.KVRebuilt}} {
		if got := turn(tc.svc); got != tc.want {
			t.Fatalf("turn %d: kv cache %q, want %q", i, got, tc.want)
		}
	}
}

// TestRedisDownAndBack: with Redis down a store call fails with a clear
// unavailable error (in seconds); after a restart everything acknowledged
// is there (append-only file, fsync always) and writes work again.
func TestRedisDownAndBack(t *testing.T) {
	srv := redistest.Start(t)
	st := openRedis(t, srv)
	ctx := context.Background()
	s := &session.Session{ID: mustID(t), Messages: turnMsgs("kept", "yes")}
	mustPut(t, st, s)

	srv.Kill()
	_, err := st.Get(ctx, s.ID)
	wantCode(t, err, parley.EUnavailable)
	s.Messages = append(s.Messages, turnMsgs("lost", "no")...)
	wantCode(t, st.Put(ctx, s), parley.EUnavailable)

	srv.Restart(t)
	got := mustGet(t, st, s.ID)
	if len(got.Messages) != 2 || got.Messages[0].Content != "kept" {
		t.Fatalf("after a restart: %v", got.Messages)
	}
	got.Messages = append(got.Messages, turnMsgs("again", "ok")...)
	mustPut(t, st, got)
	if n := len(mustGet(t, st, s.ID).Messages); n != 4 {
		t.Fatalf("%d messages after writing again, want 4", n)
	}
}

// TestRedisPutConflict: a write from a stale read is refused and changes
// nothing, neither in the store nor in the caller's session.
func TestRedisPutConflict(t *testing.T) {
	srv := redistest.Start(t)
	a, b := openRedis(t, srv), openRedis(t, srv)
	s := &session.Session{ID: mustID(t)}
	mustPut(t, a, s)
	r1, r2 := mustGet(t, a, s.ID), mustGet(t, b, s.ID)
	r1.Messages = turnMsgs("one", "1")
	mustPut(t, a, r1)
	stale := r2.Updated
	r2.Messages = turnMsgs("two", "2")
	if err := b.Put(context.Background(), r2); err != session.ErrConflict {
		t.Fatalf("stale Put = %v, want ErrConflict", err)
	}
	if !r2.Updated.Equal(stale) {
		t.Fatal("a refused Put changed the caller's version")
	}
	if got := mustGet(t, b, s.ID); got.Messages[0].Content != "one" {
		t.Fatalf("stored %v", got.Messages)
	}
	// A new session must not overwrite an existing one.
	if err := b.Put(context.Background(), &session.Session{ID: s.ID}); err != session.ErrConflict {
		t.Fatalf("Put of a fresh copy over a stored session = %v, want ErrConflict", err)
	}
}

// TestRedisResponseSurvivesConflict: a Responses turn whose commit meets
// another replica's write (its turn committed while this one ran) is
// stored on top of it with its input items and its record, so the
// response can still be fetched and chained.
func TestRedisResponseSurvivesConflict(t *testing.T) {
	srv := redistest.Start(t)
	release := make(chan struct{})
	held := func(ctx context.Context, c call, r *fakeReply) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		echo(ctx, c, r)
	}
	svcA, _ := newService(t, openRedis(t, srv), held)
	svcB, _ := newService(t, openRedis(t, srv), echo)
	ctx := context.Background()
	id := mustOpenSession(t, svcA).ID

	resp, err := svcA.Respond(ctx, parley.Caller{}, session.ResponseRequest{Conversation: id, Params: parley.DefaultParams(),
		Input: []parley.Message{{Role: parley.RoleUser, Content: "context item"}, {Role: parley.RoleUser, Content: "from a"}}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := svcB.Turn(ctx, parley.Caller{}, id, "from b", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, tr)
	close(release)
	if _, final := drain(t, resp.Turn); final.Finish != parley.FinishEOS {
		t.Fatalf("response ended %s: %v", final.Finish, final.Err)
	}

	rec, sess, err := svcB.GetResponse(ctx, parley.Caller{}, resp.Record.ID)
	if err != nil {
		t.Fatalf("the response is gone after the conflict: %v", err)
	}
	var got []string
	for _, m := range sess.Messages {
		got = append(got, m.Content)
	}
	want := []string{"from b", "reply to from b", "context item", "from a", "reply to from a"}
	if !slices.Equal(got, want) {
		t.Fatalf("stored %q, want %q", got, want)
	}
	if rec.Start != 2 || rec.End != 5 || rec.OutputTokens != 7 {
		t.Fatalf("record %+v, want positions 2..5 and the reply's usage", rec)
	}
}
