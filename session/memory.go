package session

import (
	"container/list"
	"context"
	"crypto/rand"
	"sync"
	"time"

	"go.uber.org/zap"
)

// MemoryStore keeps sessions in a map, for tests and for servers that need
// no durability. Sessions are lost when the process ends.
type MemoryStore struct {
	cfg storeConfig
	jan *janitor

	mu sync.Mutex
	// Invariants (under mu): byID and lru hold the same sessions; lru is
	// ordered by last Put, most recent at the front, so its back is the
	// least recently updated session, the first to evict or expire.
	byID    map[string]*list.Element // values of lru are *Session
	lru     *list.List
	closed  bool
	owned   map[string]int // Owner -> sessions in lru with that owner ("" not counted)
	led     *ledger        // the bytes of each session in byID, by Owner (budget.go)
	refused refusals
	idKey   []byte // response ids' key (IDKey); fixed at creation
}

var (
	_ Store      = (*MemoryStore)(nil)
	_ IDKeyStore = (*MemoryStore)(nil)
	_ Admitter   = (*MemoryStore)(nil)
	_ Lister     = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty in-memory store and starts its janitor;
// Close stops it.
func NewMemoryStore(opts ...StoreOption) *MemoryStore {
	m := &MemoryStore{cfg: newStoreConfig(opts), byID: make(map[string]*list.Element), lru: list.New(),
		owned: make(map[string]int), led: newLedger(), idKey: make([]byte, idKeyBytes)}
	_, _ = rand.Read(m.idKey) // never fails (crypto/rand panics rather than return an error)
	if m.cfg.ttl > 0 && m.cfg.interval > 0 {
		m.jan = startJanitor(m.cfg.interval, m.cfg.log.With(zap.String("store", "memory")), m.Expire)
	}
	return m
}

// Get implements Store.
func (m *MemoryStore) Get(ctx context.Context, id string) (*Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	e, ok := m.byID[id]
	if !ok {
		return nil, errNotFound()
	}
	s := e.Value.(*Session)
	if m.cfg.expired(s.Updated, m.cfg.stamp()) {
		return nil, errNotFound()
	}
	return s.Clone(), nil
}

// Put implements Store.
func (m *MemoryStore) Put(ctx context.Context, s *Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed()
	}
	// prepare under mu, so stamps and lru order agree.
	cp, err := m.cfg.prepare(s)
	if err != nil {
		return err
	}
	n, err := recordBytes(cp)
	if err != nil {
		return err
	}
	if err := m.led.check(&m.cfg, cp.ID, cp.Owner, n); err != nil {
		m.refused.count(err)
		return err
	}
	if e, ok := m.byID[cp.ID]; ok {
		m.own(e.Value.(*Session).Owner, -1)
		m.own(cp.Owner, 1)
		m.led.set(cp.ID, cp.Owner, n)
		e.Value = cp
		m.lru.MoveToFront(e)
		return nil
	}
	now := cp.Updated
	if err := m.ownerFullLocked(cp.Owner, now); err != nil {
		return err
	}
	for m.cfg.maxSessions > 0 && m.lru.Len() >= m.cfg.maxSessions {
		back := m.lru.Back()
		if ok, wait := m.cfg.evictable(back.Value.(*Session).Updated, now); !ok {
			return m.cfg.errStoreFull(wait)
		}
		m.removeLocked(back)
	}
	m.byID[cp.ID] = m.lru.PushFront(cp)
	m.own(cp.Owner, 1)
	m.led.set(cp.ID, cp.Owner, n) // after the evictions above
	return nil
}

// Delete implements Store.
func (m *MemoryStore) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed()
	}
	if e, ok := m.byID[id]; ok {
		m.removeLocked(e)
	}
	return nil
}

// Len implements Store.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Len()
}

// Expire deletes every expired session now and returns how many it deleted.
// The janitor calls it every interval.
func (m *MemoryStore) Expire(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, errClosed()
	}
	now := m.cfg.stamp()
	n := 0
	for e := m.lru.Back(); e != nil && m.cfg.expired(e.Value.(*Session).Updated, now); e = m.lru.Back() {
		m.removeLocked(e)
		n++
	}
	return n, nil
}

// Close implements Store. It is safe to call more than once.
func (m *MemoryStore) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	// Stop outside mu: a sweep in progress needs mu to finish.
	m.jan.stop()
	m.mu.Lock()
	m.byID, m.lru, m.led = nil, list.New(), newLedger()
	m.mu.Unlock()
	return nil
}

func (m *MemoryStore) removeLocked(e *list.Element) {
	s := m.lru.Remove(e).(*Session)
	delete(m.byID, s.ID)
	m.own(s.Owner, -1)
	m.led.remove(s.ID)
}

// own adds d to owner's count (under mu).
func (m *MemoryStore) own(owner string, d int) {
	if owner == "" {
		return
	}
	if m.owned[owner] += d; m.owned[owner] <= 0 {
		delete(m.owned, owner)
	}
}

// IDKey implements IDKeyStore: a random key for the store's life.
func (m *MemoryStore) IDKey(context.Context) ([]byte, error) { return m.idKey, nil }

// ownerFullLocked returns errOwnerFull when owner already holds
// maxPerOwner sessions (Retry-After from its oldest one); m.mu is held.
func (m *MemoryStore) ownerFullLocked(owner string, now time.Time) error {
	if owner == "" || m.cfg.maxPerOwner <= 0 || m.owned[owner] < m.cfg.maxPerOwner {
		return nil
	}
	var oldest time.Time
	for e := m.lru.Back(); e != nil; e = e.Prev() {
		if v := e.Value.(*Session); v.Owner == owner {
			oldest = v.Updated
			break
		}
	}
	return m.cfg.errOwnerFull(oldest, now)
}

// Admit implements Admitter.
func (m *MemoryStore) Admit(ctx context.Context, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed()
	}
	now := m.cfg.stamp()
	if err := m.ownerFullLocked(owner, now); err != nil {
		return err
	}
	if m.cfg.maxSessions > 0 && m.lru.Len() >= m.cfg.maxSessions {
		if ok, wait := m.cfg.evictable(m.lru.Back().Value.(*Session).Updated, now); !ok {
			return m.cfg.errStoreFull(wait)
		}
	}
	return nil
}

// Usage implements UsageReporter.
func (m *MemoryStore) Usage() Usage {
	m.mu.Lock()
	u := Usage{Bytes: m.led.total, Budget: max(m.cfg.maxStoreBytes, 0), ClientShare: m.cfg.clientShareBytes()}
	m.mu.Unlock()
	m.refused.fill(&u)
	return u
}

// ClientBytes implements UsageReporter.
func (m *MemoryStore) ClientBytes(key string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.led.owners[key]
}

// UserSessions implements Lister.
func (m *MemoryStore) UserSessions(ctx context.Context, user string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	var ids []string
	for e := m.lru.Front(); e != nil; e = e.Next() {
		if s := e.Value.(*Session); s.User == user {
			ids = append(ids, s.ID)
		}
	}
	return ids, nil
}
