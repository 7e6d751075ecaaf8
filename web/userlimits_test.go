package web_test

// Limits follow the user: named users behind one
// address (a NAT, a proxy) each get their own per-client limits, and one
// cannot evict the other's unused sessions.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

func TestLimitsFollowTheUser(t *testing.T) {
	const alice, bob = "alice-key-1", "bob-key-2"
	store := session.NewMemoryStore()
	frozen := time.Now()
	s := openStack(t, stackOpts{maxTokens: 4, store: store,
		cfg: func(c *web.Config) {
			c.Users = []web.UserKey{{User: "alice", Key: alice}, {User: "bob", Key: bob}}
		},
		svcOpts: []session.Option{session.WithClientLimits(3, 2), session.WithServiceClock(func() time.Time { return frozen })},
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
	auth := func(key string) http.Header { return http.Header{"Authorization": {"Bearer " + key}} }
	create := func(key string) int {
		req, _ := http.NewRequest("POST", s.base+"/v1/conversations", strings.NewReader(`{}`))
		req.Header = auth(key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	// Alice's unused chat: a socket that never ran a turn.
	ws := dial(t, s.url+"/ws?format=json", auth(alice))
	sid := readJSON(t, ws).SessionID()
	ws.Close()
	if got, err := store.Get(context.Background(), sid); err != nil || got.Owner != "user:alice" {
		t.Fatalf("alice's session: %+v, %v; want owned by user:alice", got, err)
	}

	// Bob, from the same address: more unused sockets than one client may
	// hold (2), then a conversation past his creation rate (3 a minute).
	var bobs []string
	for range 3 {
		ws := dial(t, s.url+"/ws?format=json", auth(bob))
		bobs = append(bobs, readJSON(t, ws).SessionID())
		ws.Close()
	}
	if got := create(bob); got != http.StatusTooManyRequests {
		t.Fatalf("bob's fourth creation in a minute: %d, want 429", got)
	}
	// What that took is bob's own: alice's unused chat is whole and her
	// own creations are untouched by bob's rate.
	if _, err := store.Get(context.Background(), sid); err != nil {
		t.Fatalf("bob's sockets evicted alice's unused chat: %v", err)
	}
	for i := range 2 {
		if got := create(alice); got != http.StatusOK {
			t.Fatalf("alice's creation %d after bob's: %d", i, got)
		}
	}
	if _, err := store.Get(context.Background(), sid); err != nil {
		t.Fatalf("alice's unused chat after her own creations: %v", err)
	}
	// Bob's oldest unused chat went for his third: his own.
	if _, err := store.Get(context.Background(), bobs[0]); err == nil {
		b, _ := json.Marshal(bobs)
		t.Fatalf("bob holds 3 unused chats %s, over his 2", b)
	}
}
