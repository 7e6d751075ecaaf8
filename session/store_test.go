package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

func TestNewIDAndValidID(t *testing.T) {
	seen := make(map[string]bool)
	for range 1000 {
		id := mustID(t)
		if len(id) != 22 || !session.ValidID(id) {
			t.Fatalf("NewID() = %q: want 22 chars that ValidID accepts", id)
		}
		if seen[id] {
			t.Fatalf("NewID repeated %q", id)
		}
		seen[id] = true
	}
	good := mustID(t)
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{good, true},
		{"AAAAAAAAAAAAAAAAAAAAAA", true},
		{"", false},
		{good[:21], false},
		{good + "A", false},
		{"AAAAAAAAAAAAAAAAAAAAA+", false},    // not URL-safe
		{"AAAAAAAAAAAAAAAAAAAAA/", false},    // not URL-safe
		{"AAAAAAAAAAAAAAAAAAAAA=", false},    // padding
		{"AAAAAAAAAAAAAAAAAAAAAB", false},    // unused trailing bits set: a second spelling of an id
		{"../../../../etc/passwd", false},    // 22 chars, not base64url
		{"AAAAAAAAAAAAAAAAAAAA\x00A", false}, // NUL
	} {
		if got := session.ValidID(tc.id); got != tc.want {
			t.Errorf("ValidID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}

func TestSessionClone(t *testing.T) {
	p := parley.DefaultParams()
	p.Stop = []string{"\nUser:"}
	p.JSONSchema = json.RawMessage(`{"type":"object"}`)
	s := &session.Session{ID: mustID(t), System: "sys", Messages: turnMsgs("hi", "hello"), Params: &p}
	c := s.Clone()
	if !reflect.DeepEqual(s, c) {
		t.Fatalf("clone differs: %+v vs %+v", c, s)
	}
	c.Messages[0].Content = "changed"
	c.Params.Stop[0] = "changed"
	c.Params.JSONSchema[0] = '['
	c.Params.MaxTokens = 1
	if s.Messages[0].Content != "hi" || s.Params.Stop[0] != "\nUser:" || s.Params.JSONSchema[0] != '{' || s.Params.MaxTokens != p.MaxTokens {
		t.Fatalf("changing the clone changed the original: %+v %+v", s, s.Params)
	}
	if (*session.Session)(nil).Clone() != nil {
		t.Fatal("nil.Clone() != nil")
	}
}

func TestStoreRoundTrip(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now))
			ctx := context.Background()

			p := parley.DefaultParams()
			p.Stop = []string{"\nUser:", "</s>"}
			p.JSONSchema = json.RawMessage(`{"type":"object"}`)
			p.Tools = []parley.Tool{{Name: "get_weather", Description: "Weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}}
			p.ToolChoice = parley.ToolChoice{Mode: parley.ToolFunction, Name: "get_weather"}
			msgs := append(turnMsgs("héllo 👋", "hi\x00there"),
				parley.Message{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
				parley.Message{Role: parley.RoleTool, Content: `{"temp": 21}`, ToolCallID: "call_1", Name: "get_weather"})
			s := &session.Session{ID: mustID(t), System: "You are terse.", Messages: msgs, Params: &p, Model: "qwen3-8b"}
			in := s.Clone()
			mustPut(t, st, s)
			if !s.Created.Equal(clk.Now()) || !s.Updated.Equal(clk.Now()) {
				t.Fatalf("Put did not stamp the caller's session: created %v updated %v, want %v", s.Created, s.Updated, clk.Now())
			}
			got := mustGet(t, st, s.ID)
			if !reflect.DeepEqual(got, s) {
				t.Fatalf("Get = %+v\nwant %+v", got, s)
			}
			in.Created, in.Updated = s.Created, s.Updated
			if !reflect.DeepEqual(got, in) {
				t.Fatalf("stored session differs from the one put: %+v vs %+v", got, in)
			}
			if st.Len() != 1 {
				t.Fatalf("Len = %d, want 1", st.Len())
			}

			// Replacing keeps Created and moves Updated; Len does not grow.
			created := s.Created
			clk.Advance(time.Minute)
			got.Messages = append(got.Messages, turnMsgs("again", "sure")...)
			got.Params = nil
			mustPut(t, st, got)
			again := mustGet(t, st, s.ID)
			if !again.Created.Equal(created) || !again.Updated.Equal(clk.Now()) {
				t.Fatalf("after update: created %v updated %v, want %v and %v", again.Created, again.Updated, created, clk.Now())
			}
			if len(again.Messages) != 6 || again.Params != nil {
				t.Fatalf("after update: %+v", again)
			}
			if st.Len() != 1 {
				t.Fatalf("Len = %d after replacing, want 1", st.Len())
			}

			// Absent and malformed ids are not found; bad sessions are refused.
			_, err := st.Get(ctx, mustID(t))
			wantCode(t, err, parley.ENotFound)
			_, err = st.Get(ctx, "not an id")
			wantCode(t, err, parley.ENotFound)
			wantCode(t, st.Put(ctx, &session.Session{ID: "../escape"}), parley.EInvalid)
			wantCode(t, st.Put(ctx, nil), parley.EInvalid)

			// A cancelled context is honoured.
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := st.Get(cctx, s.ID); err == nil {
				t.Fatal("Get with a cancelled context succeeded")
			}
		})
	}
}

func TestStoreReturnsCopies(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k)
			p := parley.DefaultParams()
			p.Stop = []string{"stop"}
			s := &session.Session{ID: mustID(t), System: "sys", Messages: turnMsgs("a", "b"), Params: &p}
			mustPut(t, st, s)

			// Changing what was put changes nothing stored.
			s.Messages[0].Content = "mutated"
			s.Params.Stop[0] = "mutated"
			s.System = "mutated"
			got := mustGet(t, st, s.ID)
			if got.Messages[0].Content != "a" || got.Params.Stop[0] != "stop" || got.System != "sys" {
				t.Fatalf("store shares memory with the put session: %+v %+v", got, got.Params)
			}
			// Nor does changing what Get returned.
			got.Messages[1].Content = "mutated"
			got.Messages = append(got.Messages, parley.Message{Role: parley.RoleUser, Content: "extra"})
			got.Params.Stop[0] = "mutated"
			again := mustGet(t, st, s.ID)
			if len(again.Messages) != 2 || again.Messages[1].Content != "b" || again.Params.Stop[0] != "stop" {
				t.Fatalf("store shares memory with a Get result: %+v", again)
			}
		})
	}
}

func TestStoreTTL(t *testing.T) {
	const ttl = time.Hour
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now), session.WithTTL(ttl), session.WithJanitorInterval(0))
			ctx := context.Background()
			old := &session.Session{ID: mustID(t)}
			kept := &session.Session{ID: mustID(t)}
			mustPut(t, st, old)
			mustPut(t, st, kept)

			// A Put refreshes: kept is touched half way, old is not.
			clk.Advance(ttl / 2)
			mustPut(t, st, kept)
			clk.Advance(ttl / 2) // old is exactly ttl idle: still alive
			mustGet(t, st, old.ID)
			clk.Advance(time.Nanosecond)
			_, err := st.Get(ctx, old.ID)
			wantCode(t, err, parley.ENotFound)
			mustGet(t, st, kept.ID)
			if st.Len() != 2 {
				t.Fatalf("Len = %d before the sweep, want 2 (expired but not yet deleted)", st.Len())
			}

			n, err := expire(ctx, st)
			if err != nil || n != 1 {
				t.Fatalf("Expire = %d, %v; want 1, nil", n, err)
			}
			if st.Len() != 1 {
				t.Fatalf("Len = %d after the sweep, want 1", st.Len())
			}
			mustGet(t, st, kept.ID)

			clk.Advance(ttl)
			if n, err := expire(ctx, st); err != nil || n != 1 || st.Len() != 0 {
				t.Fatalf("second Expire = %d, %v, Len %d; want 1, nil, 0", n, err, st.Len())
			}
		})
	}
}

// expire runs the concrete store's sweep, which the Store interface does not carry.
func expire(ctx context.Context, st session.Store) (int, error) {
	return st.(interface {
		Expire(context.Context) (int, error)
	}).Expire(ctx)
}

func TestStoreJanitorDeletesExpired(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now), session.WithTTL(time.Minute),
				session.WithJanitorInterval(5*time.Millisecond))
			for range 3 {
				mustPut(t, st, &session.Session{ID: mustID(t)})
			}
			time.Sleep(30 * time.Millisecond)
			if st.Len() != 3 {
				t.Fatalf("janitor deleted live sessions: Len = %d", st.Len())
			}
			clk.Advance(time.Minute + time.Second)
			deadline := time.Now().Add(time.Minute) // catches a hang only
			for st.Len() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("janitor left %d expired sessions", st.Len())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

func TestStoreEvictsLeastRecentlyUpdated(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			clk := newClock()
			st := mustOpen(t, k, session.WithClock(clk.Now), session.WithMaxSessions(3))
			ctx := context.Background()
			put := func(s *session.Session) {
				t.Helper()
				clk.Advance(time.Second)
				mustPut(t, st, s)
			}
			a, b, c, d, e := &session.Session{ID: mustID(t)}, &session.Session{ID: mustID(t)},
				&session.Session{ID: mustID(t)}, &session.Session{ID: mustID(t)}, &session.Session{ID: mustID(t)}
			put(a)
			put(b)
			put(c)
			put(a) // a is now the most recent; b is the least recently updated
			if st.Len() != 3 {
				t.Fatalf("Len = %d, want 3", st.Len())
			}
			put(d)
			if st.Len() != 3 {
				t.Fatalf("Len = %d after eviction, want 3", st.Len())
			}
			_, err := st.Get(ctx, b.ID)
			wantCode(t, err, parley.ENotFound)
			for _, s := range []*session.Session{a, c, d} {
				mustGet(t, st, s.ID)
			}
			put(e) // now c is the oldest
			_, err = st.Get(ctx, c.ID)
			wantCode(t, err, parley.ENotFound)
			for _, s := range []*session.Session{a, d, e} {
				mustGet(t, st, s.ID)
			}
		})
	}
}

func TestStoreByteCap(t *testing.T) {
	// Each message costs len(role) + len(content): "user"+8 = 12, "assistant"+8 = 17,
	// so one turn of 8-byte contents costs 29 bytes.
	msg := func(i int) string { return fmt.Sprintf("msg%05d", i) }
	turns := func(n int) []parley.Message {
		var m []parley.Message
		for i := range n {
			m = append(m, turnMsgs(msg(2*i), msg(2*i+1))...)
		}
		return m
	}
	tests := []struct {
		name     string
		maxBytes int
		system   string
		msgs     []parley.Message
		want     []parley.Message // nil: error
		wantCode string
	}{
		{"fits", 100, "", turns(3), turns(3), ""},
		{"exactly fits", 87, "", turns(3), turns(3), ""},
		{"drops the oldest turn", 86, "", turns(3), turns(3)[2:], ""},
		{"system counts", 87, "s", turns(3), turns(3)[2:], ""},
		{"drops several turns", 30, "", turns(5), turns(5)[8:], ""},
		{"a trailing user message is a turn", 29, "", append(turns(1), turnMsgs(msg(9))...), turnMsgs(msg(9)), ""},
		{"newest turn too large: kept whole, the ones before dropped", 28, "", turns(2), turns(2)[2:], ""},
		{"leading assistant message goes with the first turn", 29,
			"", append([]parley.Message{{Role: parley.RoleAssistant, Content: "greeting"}}, turns(1)...), turns(1), ""},
		{"system alone too large", 4, "12345", nil, nil, parley.ETooLarge},
		{"no cap", 0, strings.Repeat("x", 2<<20), turns(2), turns(2), ""},
	}
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					st := mustOpen(t, k, session.WithMaxBytes(tc.maxBytes))
					s := &session.Session{ID: mustID(t), System: tc.system, Messages: tc.msgs}
					err := st.Put(context.Background(), s)
					if tc.wantCode != "" {
						wantCode(t, err, tc.wantCode)
						if st.Len() != 0 {
							t.Fatal("a refused session was stored")
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					got := mustGet(t, st, s.ID)
					if len(got.Messages) != len(tc.want) || (len(tc.want) > 0 && !reflect.DeepEqual(got.Messages, tc.want)) {
						t.Fatalf("stored messages = %v, want %v", got.Messages, tc.want)
					}
					if !reflect.DeepEqual(s.Messages, got.Messages) && len(got.Messages)+len(s.Messages) > 0 {
						t.Fatalf("Put did not write the trimmed history back: caller has %v, store %v", s.Messages, got.Messages)
					}
					if tc.maxBytes > 0 && got.Bytes() > tc.maxBytes && len(got.Messages) > 2 {
						t.Fatalf("stored %d bytes, cap %d", got.Bytes(), tc.maxBytes)
					}
				})
			}
		})
	}
}

func TestStoreDeleteAndClose(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := k.open(t, t.TempDir())
			ctx := context.Background()
			a, b := &session.Session{ID: mustID(t)}, &session.Session{ID: mustID(t)}
			mustPut(t, st, a)
			mustPut(t, st, b)
			if err := st.Delete(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
			if err := st.Delete(ctx, a.ID); err != nil {
				t.Fatalf("deleting an absent session: %v", err)
			}
			_, err := st.Get(ctx, a.ID)
			wantCode(t, err, parley.ENotFound)
			if st.Len() != 1 {
				t.Fatalf("Len = %d, want 1", st.Len())
			}
			mustGet(t, st, b.ID)

			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			_, err = st.Get(ctx, b.ID)
			wantCode(t, err, parley.EUnavailable)
			wantCode(t, st.Put(ctx, b), parley.EUnavailable)
			wantCode(t, st.Delete(ctx, b.ID), parley.EUnavailable)
		})
	}
}

// TestStoreConcurrent hammers one store from several goroutines (run with
// -race) and checks the bounds and that no session is ever torn: each
// writer stores sessions whose every message names the writer.
func TestStoreConcurrent(t *testing.T) {
	const (
		writers = 4
		ops     = 40
		ids     = 12
		max     = 8
	)
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k, session.WithMaxSessions(max), session.WithMaxBytes(400))
			ctx := context.Background()
			idList := make([]string, ids)
			for i := range idList {
				idList[i] = mustID(t)
			}
			var wg sync.WaitGroup
			errs := make(chan error, writers*ops)
			for w := range writers {
				wg.Go(func() {
					tag := fmt.Sprintf("writer%d", w)
					for i := range ops {
						id := idList[(w*7+i)%ids]
						switch i % 4 {
						case 0, 1:
							s, err := st.Get(ctx, id)
							if isNotFound(err) {
								s = &session.Session{ID: id}
							} else if err != nil {
								errs <- err
								return
							}
							for j := range s.Messages {
								s.Messages[j].Content = tag // a writer rewrites the whole history with its tag
							}
							s.Messages = append(s.Messages, turnMsgs(tag, tag)...)
							if err := st.Put(ctx, s); errors.Is(err, session.ErrConflict) {
								continue // a shared store refuses a stale write; nothing was stored
							} else if err != nil {
								errs <- err
								return
							}
						case 2:
							s, err := st.Get(ctx, id)
							if err != nil {
								if !isNotFound(err) {
									errs <- err
								}
								continue
							}
							for _, m := range s.Messages {
								if m.Content != s.Messages[0].Content {
									errs <- fmt.Errorf("torn session %s: %v", id, s.Messages)
									return
								}
							}
						case 3:
							if i%8 == 3 {
								if err := st.Delete(ctx, id); err != nil {
									errs <- err
									return
								}
							}
						}
						if n := st.Len(); n > max {
							errs <- fmt.Errorf("Len = %d over the bound %d", n, max)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// Len agrees with what Get finds.
			found := 0
			for _, id := range idList {
				if s, err := st.Get(ctx, id); err == nil {
					found++
					if s.Bytes() > 400 {
						t.Errorf("session %s holds %d bytes over the cap", id, s.Bytes())
					}
				}
			}
			if found != st.Len() {
				t.Errorf("Get finds %d sessions, Len says %d", found, st.Len())
			}
		})
	}
}
