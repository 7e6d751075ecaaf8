package session

import (
	"container/list"
	"context"
	"sync"

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
	led     *ledger // the bytes of each session in byID (budget.go)
	refused refusals
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty in-memory store and starts its janitor;
// Close stops it.
func NewMemoryStore(opts ...StoreOption) *MemoryStore {
	m := &MemoryStore{cfg: newStoreConfig(opts), byID: make(map[string]*list.Element), lru: list.New(), led: newLedger()}
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
	client := ClientOf(ctx)
	if err := m.led.check(&m.cfg, cp.ID, client, n); err != nil {
		m.refused.count(err)
		return err
	}
	defer m.led.set(cp.ID, client, n) // after the evictions below
	if e, ok := m.byID[cp.ID]; ok {
		e.Value = cp
		m.lru.MoveToFront(e)
		return nil
	}
	for m.cfg.maxSessions > 0 && m.lru.Len() >= m.cfg.maxSessions {
		m.removeLocked(m.lru.Back())
	}
	m.byID[cp.ID] = m.lru.PushFront(cp)
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
	id := m.lru.Remove(e).(*Session).ID
	delete(m.byID, id)
	m.led.remove(id)
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
