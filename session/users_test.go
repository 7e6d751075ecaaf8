package session_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// TestStoreListsUserSessions: every store lists a user's sessions, the
// most recently updated first, and forgets them when they are deleted,
// evicted or expire; the anonymous user ("") is a user like any other.
func TestStoreListsUserSessions(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now), session.WithTTL(time.Hour), session.WithMaxSessions(5))
			ctx := context.Background()
			put := func(user string) string {
				s := &session.Session{ID: mustID(t), User: user, Messages: turnMsgs("hi", "hello")}
				mustPut(t, st, s)
				clk.Advance(time.Second)
				return s.ID
			}
			a1, b1, a2, anon := put("alice"), put("bob"), put("alice"), put("")
			list := func(user string) []string {
				ids, err := st.(session.Lister).UserSessions(ctx, user)
				if err != nil {
					t.Fatal(err)
				}
				return ids
			}
			if got := list("alice"); !slices.Equal(got, []string{a2, a1}) {
				t.Fatalf("alice's sessions %v, want %v", got, []string{a2, a1})
			}
			if got := list("bob"); !slices.Equal(got, []string{b1}) {
				t.Fatalf("bob's sessions %v", got)
			}
			if got := list(""); !slices.Equal(got, []string{anon}) {
				t.Fatalf("the anonymous user's sessions %v", got)
			}
			if got := list("alic"); len(got) != 0 {
				t.Fatalf("a prefix of a name lists %v", got)
			}
			// Updating moves a session to the front.
			s := mustGet(t, st, a1)
			mustPut(t, st, s)
			clk.Advance(time.Second)
			if got := list("alice"); !slices.Equal(got, []string{a1, a2}) {
				t.Fatalf("after updating a1: %v", got)
			}
			if err := st.Delete(ctx, a1); err != nil {
				t.Fatal(err)
			}
			if got := list("alice"); !slices.Equal(got, []string{a2}) {
				t.Fatalf("after deleting a1: %v", got)
			}
			// Eviction: the store holds 5; two more push out the oldest two (b1, a2).
			put("carol")
			put("carol")
			put("carol")
			if got := list("bob"); len(got) != 0 {
				t.Fatalf("bob's evicted session is still listed: %v", got)
			}
			clk.Advance(2 * time.Hour)
			if _, err := st.(interface {
				Expire(context.Context) (int, error)
			}).Expire(ctx); err != nil {
				t.Fatal(err)
			}
			if got := list("carol"); len(got) != 0 {
				t.Fatalf("expired sessions still listed: %v", got)
			}
		})
	}
}

// TestUsersReachOnlyTheirOwn: a session of one user is, to every other
// user, exactly an unknown id: Open, Conversation, the edits, responses by
// id and the listing.
func TestUsersReachOnlyTheirOwn(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, _ := newService(t, st, echo)
	alice := parley.Caller{User: "alice"}
	bob := parley.Caller{User: "bob"}
	anon := parley.Caller{}

	sess, _, err := svc.Open(context.Background(), alice, "")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := svc.Turn(context.Background(), alice, sess.ID, "Once", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, tr)
	resp, err := svc.Respond(context.Background(), alice, session.ResponseRequest{Input: []parley.Message{{Role: parley.RoleUser, Content: "A story"}}, Params: parley.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	for range resp.Events() {
	}
	rid := resp.Record.ID

	for name, who := range map[string]parley.Caller{"bob": bob, "anonymous": anon} {
		if _, _, err := svc.Open(context.Background(), who, sess.ID); !isNotFound(err) {
			t.Errorf("%s resumed alice's session: %v", name, err)
		}
		if _, err := svc.Conversation(context.Background(), who, sess.ID); !isNotFound(err) {
			t.Errorf("%s read alice's conversation: %v", name, err)
		}
		if _, err := svc.Turn(context.Background(), who, sess.ID, "mine now", parley.Params{}); !isNotFound(err) {
			t.Errorf("%s ran a turn on alice's session: %v", name, err)
		}
		if _, err := svc.Rename(context.Background(), who, sess.ID, "x"); !isNotFound(err) {
			t.Errorf("%s renamed alice's conversation: %v", name, err)
		}
		if _, err := svc.Fork(context.Background(), who, sess.ID, 0); !isNotFound(err) {
			t.Errorf("%s forked alice's conversation: %v", name, err)
		}
		if err := svc.DeleteConversation(context.Background(), who, sess.ID); !isNotFound(err) {
			t.Errorf("%s deleted alice's conversation: %v", name, err)
		}
		if _, _, err := svc.GetResponse(context.Background(), who, rid); !isNotFound(err) {
			t.Errorf("%s read alice's response: %v", name, err)
		}
		if err := svc.DeleteResponse(context.Background(), who, rid); !isNotFound(err) {
			t.Errorf("%s deleted alice's response: %v", name, err)
		}
		if _, err := svc.Respond(context.Background(), who, session.ResponseRequest{Previous: rid, Input: []parley.Message{{Role: parley.RoleUser, Content: "x"}}, Params: parley.DefaultParams()}); !isNotFound(err) {
			t.Errorf("%s chained from alice's response: %v", name, err)
		}
		if _, err := svc.Respond(context.Background(), who, session.ResponseRequest{Conversation: sess.ID, Input: []parley.Message{{Role: parley.RoleUser, Content: "x"}}, Params: parley.DefaultParams()}); !isNotFound(err) {
			t.Errorf("%s continued alice's conversation: %v", name, err)
		}
		if page, _, err := svc.ListConversations(context.Background(), who, session.ListQuery{}); err != nil || len(page) != 0 {
			t.Errorf("%s lists %+v (%v)", name, page, err)
		}
	}
	// Alice's are untouched, and hers to list.
	got, err := svc.Conversation(context.Background(), alice, sess.ID)
	if err != nil || len(got.Messages) != 2 || got.User != "alice" {
		t.Fatalf("alice's session after the others tried: %+v, %v", got, err)
	}
	page, more, err := svc.ListConversations(context.Background(), alice, session.ListQuery{})
	if err != nil || more || len(page) != 2 || page[0].Title != "A story" || page[1].Title != "Once" {
		t.Fatalf("alice's list %+v more %v: %v", page, more, err)
	}
}

// TestListRenameForkRegenerate: the list pages newest first and filters
// by title; a rename changes the title; a fork keeps the original; a
// regenerate replaces the last reply in the stored session.
func TestListRenameForkRegenerate(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, f := newService(t, st, echo)
	ctx, alice := context.Background(), parley.Caller{User: "alice"}
	var ids []string
	for i := range 5 {
		s, _, err := svc.Open(ctx, alice, "")
		if err != nil {
			t.Fatal(err)
		}
		tr, err := svc.Turn(ctx, alice, s.ID, fmt.Sprintf("Topic %d\nmore text", i), parley.Params{})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, tr)
		ids = append(ids, s.ID)
	}
	if _, _, err := svc.Open(ctx, alice, ""); err != nil { // never used: not listed
		t.Fatal(err)
	}
	page, more, err := svc.ListConversations(ctx, alice, session.ListQuery{Limit: 2})
	if err != nil || !more || len(page) != 2 || page[0].ID != ids[4] || page[1].ID != ids[3] || page[0].Title != "Topic 4" {
		t.Fatalf("first page %+v more %v: %v", page, more, err)
	}
	page, more, err = svc.ListConversations(ctx, alice, session.ListQuery{Limit: 2, After: page[1].ID})
	if err != nil || !more || len(page) != 2 || page[0].ID != ids[2] {
		t.Fatalf("second page %+v more %v: %v", page, more, err)
	}
	page, more, err = svc.ListConversations(ctx, alice, session.ListQuery{Limit: 2, After: page[1].ID})
	if err != nil || more || len(page) != 1 || page[0].ID != ids[0] {
		t.Fatalf("last page %+v more %v: %v", page, more, err)
	}

	if _, err := svc.Rename(ctx, alice, ids[1], "Cats and dogs"); err != nil {
		t.Fatal(err)
	}
	page, _, err = svc.ListConversations(ctx, alice, session.ListQuery{Query: "DOGS"})
	if err != nil || len(page) != 1 || page[0].ID != ids[1] || page[0].Title != "Cats and dogs" {
		t.Fatalf("search %+v: %v", page, err)
	}

	// Fork keeps the first message only; the original keeps both.
	fork, err := svc.Fork(ctx, alice, ids[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	if fork.ID == ids[0] || len(fork.Messages) != 0 || fork.User != "alice" {
		t.Fatalf("fork %+v", fork)
	}
	if _, err := svc.Fork(ctx, alice, ids[0], 3); parley.ErrorCode(err) != parley.EInvalid {
		t.Fatalf("fork past the end: %v", err)
	}
	orig, _ := svc.Conversation(ctx, alice, ids[0])
	if len(orig.Messages) != 2 {
		t.Fatalf("the original after a fork: %+v", orig.Messages)
	}

	// Regenerate: the stored session holds the prompt once, and the new reply.
	before := len(f.callList())
	tr, err := svc.Regenerate(ctx, alice, ids[0], parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, tr)
	again, _ := svc.Conversation(ctx, alice, ids[0])
	if len(again.Messages) != 2 || again.Messages[0].Content != "Topic 0\nmore text" || again.Messages[1].Content != "reply to Topic 0\nmore text" {
		t.Fatalf("after regenerate: %+v", again.Messages)
	}
	calls := f.callList()
	if len(calls) != before+1 || len(calls[before].msgs) != 1 {
		t.Fatalf("regenerate sent %d messages, want the prompt alone", len(calls[before].msgs))
	}
	empty, _, _ := svc.Open(ctx, alice, "")
	if _, err := svc.Regenerate(ctx, alice, empty.ID, parley.Params{}); parley.ErrorCode(err) != parley.EInvalid {
		t.Fatalf("regenerate with no prompt: %v", err)
	}
}

// TestBoltIndexesUsersOfOlderFiles: a file written before users existed
// (no user buckets) gets its sessions indexed under their users when it is
// opened, so the list shows them.
func TestBoltIndexesUsersOfOlderFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	st, err := session.OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	a := &session.Session{ID: mustID(t), User: "alice", Messages: turnMsgs("hi", "hello")}
	anon := &session.Session{ID: mustID(t), Messages: turnMsgs("hey", "ho")}
	mustPut(t, st, a)
	mustPut(t, st, anon)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return errors.Join(tx.DeleteBucket([]byte("userof")), tx.DeleteBucket([]byte("byuser")))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st, err = session.OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for user, want := range map[string]string{"alice": a.ID, "": anon.ID} {
		ids, err := st.UserSessions(context.Background(), user)
		if err != nil || !slices.Equal(ids, []string{want}) {
			t.Fatalf("%q's sessions after reopening: %v, %v", user, ids, err)
		}
	}
	// Deleting still finds the entries the upgrade made.
	if err := st.Delete(context.Background(), a.ID); err != nil {
		t.Fatal(err)
	}
	if ids, _ := st.UserSessions(context.Background(), "alice"); len(ids) != 0 {
		t.Fatalf("after delete: %v", ids)
	}
}

// conflictOnce is a store whose Put, once armed, lets skip Puts through
// and then fails one with ErrConflict without writing: what a write meets
// when another replica wrote the session in between.
type conflictOnce struct {
	session.Store
	armed bool
	skip  int
}

func (c *conflictOnce) Put(ctx context.Context, s *session.Session) error {
	if c.armed {
		if c.skip > 0 {
			c.skip--
			return c.Store.Put(ctx, s)
		}
		c.armed = false
		return session.ErrConflict
	}
	return c.Store.Put(ctx, s)
}

// TestRegenerateAfterConflict: a regenerate whose pending write (before
// its reply) or commit meets another replica's write reapplies the drop on
// the fresh copy: the stored session holds the prompt once and the new
// reply, not both replies.
func TestRegenerateAfterConflict(t *testing.T) {
	for _, tc := range []struct {
		name string
		skip int // Puts before the conflict: 0 the pending write, 1 the commit
	}{{"pending write", 0}, {"commit", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			st := &conflictOnce{Store: mustOpen(t, storeKinds()[0])}
			svc, _ := newService(t, st, echo)
			ctx := context.Background()
			sess := mustOpenSession(t, svc)
			tr, err := svc.Turn(ctx, parley.Caller{}, sess.ID, "Once", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, tr)
			st.armed, st.skip = true, tc.skip
			tr, err = svc.Regenerate(ctx, parley.Caller{}, sess.ID, parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			if _, final := drain(t, tr); final.Err != nil || !tr.Committed() {
				t.Fatalf("regenerate: %v committed %v", final.Err, tr.Committed())
			}
			if st.armed {
				t.Fatal("the conflict was never met")
			}
			got, err := svc.Conversation(ctx, parley.Caller{}, sess.ID)
			if err != nil || len(got.Messages) != 2 || got.Messages[0].Content != "Once" || got.Messages[1].Interrupted {
				t.Fatalf("after a conflicted regenerate: %+v, %v", got, err)
			}
		})
	}
}

// TestRenameMetadataLimit: a title is a metadata key, so an untitled conversation whose metadata holds
// MaxMetadataKeys keys refuses one (EInvalid, nothing stored); a titled one is renamed in place, and "" removes it.
func TestRenameMetadataLimit(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, _ := newService(t, st, echo)
	ctx := context.Background()
	full := map[string]string{}
	for i := range session.MaxMetadataKeys {
		full[fmt.Sprintf("k%d", i)] = "v"
	}
	c, err := svc.CreateConversation(ctx, parley.Caller{}, "", nil, full)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Rename(ctx, parley.Caller{}, c.ID, "One more"); parley.ErrorCode(err) != parley.EInvalid {
		t.Fatalf("a 17th key: %v", err)
	}
	got, err := svc.Conversation(ctx, parley.Caller{}, c.ID)
	if err != nil || len(got.Metadata) != session.MaxMetadataKeys || got.Metadata[session.TitleKey] != "" {
		t.Fatalf("stored after the refusal: %v, %v", got.Metadata, err)
	}
	delete(full, "k0")
	full[session.TitleKey] = "Old"
	if _, err := svc.SetMetadata(ctx, parley.Caller{}, c.ID, full); err != nil {
		t.Fatal(err)
	}
	if got, err = svc.Rename(ctx, parley.Caller{}, c.ID, "New"); err != nil || len(got.Metadata) != session.MaxMetadataKeys || got.Title() != "New" {
		t.Fatalf("renamed in place: %v, %v", got.Metadata, err)
	}
	if got, err = svc.Rename(ctx, parley.Caller{}, c.ID, ""); err != nil || len(got.Metadata) != session.MaxMetadataKeys-1 {
		t.Fatalf("title removed: %v, %v", got.Metadata, err)
	}
}
