package session

import (
	"context"
	"sync"
)

// keyLock is a set of mutexes, one per key, whose Lock honours a context.
// It holds an entry only while some caller holds or waits for that key, so
// its size is bounded by the callers in flight, not by the keys ever seen.
type keyLock struct {
	mu sync.Mutex
	// entries: key -> its lock. Invariant (under mu): refs counts the holder
	// and the waiters; the entry is deleted when refs drops to zero.
	entries map[string]*keyLockEntry
}

type keyLockEntry struct {
	ch   chan struct{} // capacity 1: full while held; waiters queue in send order
	refs int
}

// lock waits until the caller holds key or ctx is done. On success it
// returns the function that releases key; call it exactly once.
func (l *keyLock) lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	if l.entries == nil {
		l.entries = make(map[string]*keyLockEntry)
	}
	e, ok := l.entries[key]
	if !ok {
		e = &keyLockEntry{ch: make(chan struct{}, 1)}
		l.entries[key] = e
	}
	e.refs++
	l.mu.Unlock()

	select {
	case e.ch <- struct{}{}:
		return func() {
			<-e.ch
			l.release(key, e)
		}, nil
	case <-ctx.Done():
		l.release(key, e)
		return nil, ctx.Err()
	}
}

func (l *keyLock) release(key string, e *keyLockEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(l.entries, key)
	}
}

// len is the number of keys held or waited for.
func (l *keyLock) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}
