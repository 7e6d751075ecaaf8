package session_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/session"
)

// TestMain fails the package if any goroutine (a janitor, a turn) outlives
// the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clock is a settable time source for expiry and eviction tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock {
	return &clock{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// storeKind opens a store of one implementation in dir; the contract tests
// run against every kind.
type storeKind struct {
	name string
	open func(tb testing.TB, dir string, opts ...session.StoreOption) session.Store
}

func storeKinds() []storeKind {
	return []storeKind{
		{"memory", func(tb testing.TB, _ string, opts ...session.StoreOption) session.Store {
			return session.NewMemoryStore(opts...)
		}},
		{"bolt", func(tb testing.TB, dir string, opts ...session.StoreOption) session.Store {
			tb.Helper()
			s, err := session.OpenBoltStore(filepath.Join(dir, "sessions.db"), opts...)
			if err != nil {
				tb.Fatalf("open bolt store: %v", err)
			}
			return s
		}},
		{"redis", func(tb testing.TB, _ string, opts ...session.StoreOption) session.Store {
			tb.Helper()
			srv := redistest.Start(tb)
			s, err := session.OpenRedisStore(context.Background(), srv.URL(0), "test:", opts...)
			if err != nil {
				tb.Fatalf("open redis store: %v", err)
			}
			return s
		}},
	}
}

// mustOpen opens a store of kind k in a fresh directory, closed at cleanup.
func mustOpen(tb testing.TB, k storeKind, opts ...session.StoreOption) session.Store {
	tb.Helper()
	s := k.open(tb, tb.TempDir(), opts...)
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("close store: %v", err)
		}
	})
	return s
}

func mustID(tb testing.TB) string {
	tb.Helper()
	id, err := session.NewID()
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

func mustPut(tb testing.TB, st session.Store, s *session.Session) {
	tb.Helper()
	if err := st.Put(context.Background(), s); err != nil {
		tb.Fatalf("put %s: %v", s.ID, err)
	}
}

func mustGet(tb testing.TB, st session.Store, id string) *session.Session {
	tb.Helper()
	s, err := st.Get(context.Background(), id)
	if err != nil {
		tb.Fatalf("get %s: %v", id, err)
	}
	return s
}

// wantCode fails unless err carries the parley error code.
func wantCode(tb testing.TB, err error, code string) {
	tb.Helper()
	if got := parley.ErrorCode(err); got != code {
		tb.Fatalf("error code = %q (%v), want %q", got, err, code)
	}
}

func isNotFound(err error) bool {
	var e *parley.Error
	return errors.As(err, &e) && e.Code == parley.ENotFound
}

func turnMsgs(pairs ...string) []parley.Message {
	var msgs []parley.Message
	for i, c := range pairs {
		role := parley.RoleUser
		if i%2 == 1 {
			role = parley.RoleAssistant
		}
		msgs = append(msgs, parley.Message{Role: role, Content: c})
	}
	return msgs
}
