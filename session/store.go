package session

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// Store keeps sessions. Implementations are safe for concurrent use, hand
// out and take in copies (a caller can never change stored state except by
// Put), expire sessions idle for longer than their TTL, and bound both the
// number of sessions and the bytes of each one's history.
type Store interface {
	// Get returns a copy of the session, or a parley ENotFound error when
	// there is none or it has expired.
	Get(ctx context.Context, id string) (*Session, error)
	// Put stores a copy of s as the store keeps it: Created set when zero,
	// Updated set to now, the oldest turns dropped to fit the per-session
	// byte cap. It writes those changes back into s, so after a nil return
	// *s equals what Get returns. Durable stores have committed it to disk
	// when Put returns. Storing a new id when the store is full evicts the
	// least recently updated sessions.
	Put(ctx context.Context, s *Session) error
	// Delete removes the session; deleting an absent id is not an error.
	Delete(ctx context.Context, id string) error
	// Len is the number of stored sessions, expired ones not yet swept included.
	Len() int
	// Close stops the janitor, waits for it, and releases the store.
	// Every later call returns a parley EUnavailable error.
	Close() error
}

// Defaults of the store options.
const (
	DefaultTTL             = 24 * time.Hour // idle time after which a session expires
	DefaultMaxSessions     = 10000          // sessions per store
	DefaultMaxBytes        = 1 << 20        // bytes of system prompt + history per session
	DefaultJanitorInterval = time.Minute    // how often expired sessions are deleted
)

// StoreOption configures NewMemoryStore and OpenBoltStore.
type StoreOption func(*storeConfig)

type storeConfig struct {
	ttl         time.Duration
	maxSessions int
	maxBytes    int
	interval    time.Duration
	now         func() time.Time
	log         *zap.Logger
	// The byte budget (budget.go).
	maxStoreBytes int64
	clientShare   float64
}

func newStoreConfig(opts []StoreOption) storeConfig {
	c := storeConfig{
		ttl:         DefaultTTL,
		maxSessions: DefaultMaxSessions,
		maxBytes:    DefaultMaxBytes,
		interval:    DefaultJanitorInterval,
		now:         time.Now,
		log:         zap.NewNop(),

		maxStoreBytes: DefaultMaxStoreBytes,
		clientShare:   DefaultClientShare,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithTTL sets how long a session may stay idle (not Put) before it expires.
// d <= 0 means sessions never expire.
func WithTTL(d time.Duration) StoreOption { return func(c *storeConfig) { c.ttl = d } }

// WithMaxSessions bounds the number of sessions; n <= 0 means no bound.
func WithMaxSessions(n int) StoreOption { return func(c *storeConfig) { c.maxSessions = n } }

// WithMaxBytes caps the bytes of one session (see Session.Bytes); Put drops
// the oldest turns to fit. n <= 0 means no cap.
func WithMaxBytes(n int) StoreOption { return func(c *storeConfig) { c.maxBytes = n } }

// WithJanitorInterval sets how often the janitor deletes expired sessions;
// d <= 0 disables the janitor (Get still hides expired sessions, and
// Expire can be called by hand).
func WithJanitorInterval(d time.Duration) StoreOption {
	return func(c *storeConfig) { c.interval = d }
}

// WithClock replaces time.Now, for tests of expiry and eviction order.
func WithClock(now func() time.Time) StoreOption { return func(c *storeConfig) { c.now = now } }

// WithStoreLogger sets the logger for what the janitor does (it has no
// caller to return errors to). The default discards.
func WithStoreLogger(l *zap.Logger) StoreOption { return func(c *storeConfig) { c.log = l } }

// stamp returns the current time as the store records it: wall clock only
// (no monotonic reading) and UTC, so a time survives encoding unchanged.
func (c *storeConfig) stamp() time.Time { return c.now().Round(0).UTC() }

// expired reports whether a session last updated at updated has expired at now.
// A session lives for exactly ttl after its last update.
func (c *storeConfig) expired(updated, now time.Time) bool {
	return c.ttl > 0 && now.Sub(updated) > c.ttl
}

// prepare turns the caller's session into the copy to store: it validates
// the id, stamps the times, applies the byte cap, and writes the result back
// into s (see Store.Put).
func (c *storeConfig) prepare(s *Session) (*Session, error) {
	if s == nil {
		return nil, parley.Errorf(parley.EInvalid, "no session to store")
	}
	if !ValidID(s.ID) {
		return nil, parley.Errorf(parley.EInvalid, "invalid session id")
	}
	if c.maxBytes > 0 && len(s.System) > c.maxBytes {
		return nil, &parley.Error{Code: parley.ETooLarge, Field: "system",
			Message: "the system prompt is larger than a session may hold"}
	}
	cp := s.Clone()
	now := c.stamp()
	if cp.Created.IsZero() {
		cp.Created = now
	}
	cp.Created = cp.Created.Round(0).UTC()
	cp.Updated = now
	s.Created, s.Updated = cp.Created, cp.Updated
	if kept, dropped := trimHistory(cp.Messages, len(cp.System), c.maxBytes); dropped > 0 {
		// Copy the kept suffix so the dropped prefix is not kept alive, and
		// give the caller its own copy of what was kept.
		cp.Messages = slices.Clone(kept)
		s.Messages = slices.Clone(kept)
		cp.Trimmed += dropped
		s.Trimmed = cp.Trimmed
	}
	return cp, nil
}

func errNotFound() error { return parley.Errorf(parley.ENotFound, "no such session") }

func errClosed() error { return parley.Errorf(parley.EUnavailable, "the session store is closed") }
