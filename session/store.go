package session

import (
	"context"
	"fmt"
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
	// Updated set to now, the oldest turns (never the newest) dropped to fit
	// the per-session cap of text (WithMaxBytes). It writes those changes
	// back into s, so after a nil return *s equals what Get returns.
	// Durable stores have committed it to disk when Put returns. Storing a
	// new id when the store is full evicts the
	// least recently updated sessions, but only those idle for longer than
	// the eviction floor (WithEvictFloor): when the least recently updated
	// is younger, Put stores nothing and returns a parley EStoreFull error.
	// Storing a new id whose Owner already holds WithMaxPerOwner sessions
	// returns a parley ERateLimited error. Both carry a RetryAfter. A write
	// that grows what is stored past the byte budget (WithMaxStoreBytes),
	// or its Owner's share of it (WithClientShare), stores nothing and
	// returns ErrStoreFull with a parley EStoreFull error; so does a full
	// disk.
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
	DefaultMaxBytes        = 1 << 20        // bytes of text (system prompt + history; images apart) per session
	DefaultJanitorInterval = time.Minute    // how often expired sessions are deleted
	DefaultMaxPerOwner     = 500            // sessions one client may hold (cmd/parley's default; the library's is no bound)
	DefaultEvictFloor      = 24 * time.Hour // idle time before a session may be evicted (cmd/parley's default; the library's is none)
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
	maxPerOwner int           // sessions one Owner may hold; <= 0: no bound
	evictFloor  time.Duration // idle time before eviction may take a session; <= 0: any
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

// WithMaxBytes caps the bytes of one session's text (see Session.Bytes;
// images are held to the Service's limits instead): Put drops the oldest
// turns to fit, never the newest. n <= 0 means no cap.
func WithMaxBytes(n int) StoreOption { return func(c *storeConfig) { c.maxBytes = n } }

// WithMaxPerOwner bounds the sessions one owner (Session.Owner, a client)
// may hold: storing a new id past it returns ERateLimited, whose
// RetryAfter is when the owner's least recently updated session expires.
// Sessions without an owner are not counted. n <= 0 means no bound.
func WithMaxPerOwner(n int) StoreOption { return func(c *storeConfig) { c.maxPerOwner = n } }

// WithEvictFloor sets how long a session must have been idle (not Put)
// before a full store may evict it to make room: a full store whose least
// recently updated session is younger refuses the new one (EStoreFull)
// instead. Expired sessions may always go. d <= 0 means any session may be
// evicted.
func WithEvictFloor(d time.Duration) StoreOption { return func(c *storeConfig) { c.evictFloor = d } }

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
	data := imageData(cp.Messages) // before trimming: a kept message may need a dropped one's copy
	if kept, dropped := trimHistory(shareImages(cp.Messages, data), len(cp.System), c.maxBytes, cp.keptFrom()); dropped > 0 {
		// Copy the kept suffix so the dropped prefix is not kept alive, and
		// give the caller its own copy of what was kept.
		cp.Messages = slices.Clone(kept)
		s.Messages = slices.Clone(kept)
		cp.Trimmed += dropped
		s.Trimmed = cp.Trimmed
	}
	cp.Messages = shareImages(cp.Messages, data)
	s.Messages = shareImages(s.Messages, data)
	return cp, nil
}

// evictable reports whether a full store may evict a session last updated
// at updated, at now; when not, wait is how long until it may.
func (c *storeConfig) evictable(updated, now time.Time) (ok bool, wait time.Duration) {
	if c.evictFloor <= 0 || c.expired(updated, now) {
		return true, 0
	}
	d := c.evictFloor
	if c.ttl > 0 && c.ttl < d {
		d = c.ttl
	}
	idle := now.Sub(updated)
	if idle > d {
		return true, 0
	}
	return false, d - idle
}

// errStoreFull is what storing a new session into a full store returns
// when no session has been idle long enough to evict.
func (c *storeConfig) errStoreFull(wait time.Duration) error {
	return &parley.Error{Code: parley.EStoreFull, RetryAfter: atLeastSecond(wait),
		Message: fmt.Sprintf("the session store is full (--max-sessions %d) and no session has been idle for %s; try again later",
			c.maxSessions, c.evictFloor)}
}

// errOwnerFull is what storing a new session of an owner that holds
// maxPerOwner returns; oldest is the Updated of its least recently updated
// session (zero when unknown).
func (c *storeConfig) errOwnerFull(oldest, now time.Time) error {
	wait := time.Minute
	if c.ttl > 0 && !oldest.IsZero() {
		wait = c.ttl - now.Sub(oldest)
	}
	return &parley.Error{Code: parley.ERateLimited, RetryAfter: atLeastSecond(wait),
		Message: fmt.Sprintf("your address holds %d sessions, the most one client may (--max-sessions-per-client); delete some or wait for idle ones to expire",
			c.maxPerOwner)}
}

func atLeastSecond(d time.Duration) time.Duration { return max(d, time.Second) }

func errNotFound() error { return parley.Errorf(parley.ENotFound, "no such session") }

func errClosed() error { return parley.Errorf(parley.EUnavailable, "the session store is closed") }

// Admitter is a Store that can tell, without writing, whether it would
// refuse a new session of owner now (the owner's cap, a full store with
// nothing evictable). The Service asks before it runs a turn for a session
// it has not stored yet, so a refused client gets its answer before the
// engine works for it; the Put that commits the turn still decides.
type Admitter interface {
	Admit(ctx context.Context, owner string) error
}
