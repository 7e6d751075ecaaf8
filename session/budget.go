package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/parley-chat/parley"
)

// The store's byte budget: every store counts the bytes of each session as
// it keeps it (its encoded record), in total and per owner, and refuses a
// write that would take either past its limit. A write that does not grow
// what is stored (a reset, a deleted item) is never refused, so a store over
// its budget (a budget lowered at restart) still lets clients shrink it.
//
// A session's bytes count against its owner (Session.Owner: the client that
// created it, fixed at creation: parley.Caller.Client); later writes, whoever
// makes them, count against that owner. A session forked from another
// (previous_response_id naming an older turn) is a new session with its own
// full copy of the history, owned by the client that forked it, so the
// whole copy counts against that client.
//
// The count is checked before the least recently updated sessions are
// evicted to make room for a new one, so at the session cap a write is
// refused when the budget is full even if evicting would have freed enough:
// a full store refuses rather than evicts.

// Defaults of the byte budget.
const (
	// DefaultMaxStoreBytes is the budget when none is given: 1 GiB of
	// records. At the default 10,000 sessions that is 100 KiB each on
	// average, several times a full 8k-token context of text; memory and
	// Redis hold it comfortably on a small machine, and bbolt's file stays
	// near it after compaction.
	DefaultMaxStoreBytes = 1 << 30
	// DefaultClientShare is the fraction of the budget one client key may
	// hold: one address alone can use a tenth of the store, never all of it.
	DefaultClientShare = 0.1
)

// ErrStoreFull marks a write refused for want of bytes: the store's byte
// budget, the owner's share of it, or its disk. The error also carries a
// parley EStoreFull error whose message says which limit (the code a full
// session count answers too: to a client both mean the store has no room
// for it now).
var ErrStoreFull = errors.New("session store full")

// Refusal reasons (Usage's counters).
const (
	FullBudget = "budget"       // the store's byte budget
	FullShare  = "client_share" // the owner's share of the budget
	FullDisk   = "disk"         // the disk (or Redis's memory) refused the write
)

// WithMaxStoreBytes sets the store's byte budget: the bytes of every stored
// record together. n <= 0 means no budget.
func WithMaxStoreBytes(n int64) StoreOption { return func(c *storeConfig) { c.maxStoreBytes = n } }

// WithClientShare sets the fraction (0 < f <= 1) of the byte budget that the
// sessions of one owner may hold together. f <= 0 or f >= 1 means no share
// limit beyond the budget itself.
func WithClientShare(f float64) StoreOption { return func(c *storeConfig) { c.clientShare = f } }

// clientShareBytes is the most one owner may hold; 0 means no limit.
func (c *storeConfig) clientShareBytes() int64 {
	if c.maxStoreBytes <= 0 || c.clientShare <= 0 || c.clientShare >= 1 {
		return 0
	}
	return max(int64(float64(c.maxStoreBytes)*c.clientShare), 1)
}

// Usage is a store's byte budget and what it holds, for /metrics.
type Usage struct {
	Bytes       int64 // bytes of the stored records
	Budget      int64 // the byte budget; 0 = none
	ClientShare int64 // the most one owner may hold; 0 = no share limit
	// Writes refused since the store opened (this process's), by reason.
	RefusedBudget, RefusedShare, RefusedDisk int64
}

// UsageReporter is implemented by the stores that count their bytes (all of
// this package's).
type UsageReporter interface {
	Usage() Usage
	// ClientBytes is the bytes of the sessions owned by client key.
	ClientBytes(key string) int64
}

// refusals counts refused writes by reason.
type refusals struct{ budget, share, disk atomic.Int64 }

func (r *refusals) count(err error) {
	var be *budgetError
	switch {
	case errors.As(err, &be) && be.reason == FullShare:
		r.share.Add(1)
	case errors.As(err, &be):
		r.budget.Add(1)
	case errors.Is(err, ErrStoreFull):
		r.disk.Add(1)
	}
}

func (r *refusals) fill(u *Usage) {
	u.RefusedBudget, u.RefusedShare, u.RefusedDisk = r.budget.Load(), r.share.Load(), r.disk.Load()
}

// budgetError is a write refused by the byte budget or a client's share.
type budgetError struct {
	reason string // FullBudget or FullShare
	safe   *parley.Error
}

func (e *budgetError) Error() string   { return e.safe.Message }
func (e *budgetError) Unwrap() []error { return []error{e.safe, ErrStoreFull} }

func errBudget(limit int64) error {
	return &budgetError{reason: FullBudget, safe: parley.Errorf(parley.EStoreFull,
		"the session store is full: this write would take it past its byte budget of %s (max-store-bytes); delete conversations or try again later", humanBytes(limit))}
}

func errShare(held, limit int64) error {
	return &budgetError{reason: FullShare, safe: parley.Errorf(parley.EStoreFull,
		"your conversations hold %s of the session store and this write would take them past the %s one client may hold (its share of max-store-bytes); delete some to store more",
		humanBytes(held), humanBytes(limit))}
}

// errDiskFull wraps a write error that says the disk (or Redis's memory) is
// full: a parley EStoreFull error for the client, the cause for the log.
func errDiskFull(op string, cause error) error {
	return &storeError{op: op, cause: fmt.Errorf("%w: %w", ErrStoreFull, cause),
		safe: parley.Errorf(parley.EStoreFull, "the session store's disk is full; nothing was stored, what was stored before is kept")}
}

// diskFull reports whether err is the file system saying there is no room:
// no space, over quota, or over the process's file size limit.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG)
}

// redisFull reports whether err is Redis refusing a write for want of room:
// maxmemory reached (OOM), or persistence failing (MISCONF, typically a
// full disk under its RDB snapshots).
func redisFull(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "OOM ") || strings.HasPrefix(msg, "MISCONF ")
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ledger counts the bytes of each session, in total and per owner
// (Session.Owner), for the stores kept in this process (memory, bbolt); the
// Redis store keeps the same counts in Redis, for all replicas. Not safe
// for concurrent use: its store guards it with the lock that serializes its
// writes.
type ledger struct {
	sizes  map[string]ledgerEntry
	total  int64
	owners map[string]int64
}

type ledgerEntry struct {
	size  int64
	owner string
}

func newLedger() *ledger {
	return &ledger{sizes: make(map[string]ledgerEntry), owners: make(map[string]int64)}
}

// check returns the error of storing n bytes as session id owned by owner,
// or nil when the budget and the owner's share have room. Only a write that
// grows what is held can be refused.
func (l *ledger) check(c *storeConfig, id, owner string, n int64) error {
	old := l.sizes[id]
	grow := n - old.size
	if grow <= 0 {
		return nil
	}
	if c.maxStoreBytes > 0 && l.total+grow > c.maxStoreBytes {
		return errBudget(c.maxStoreBytes)
	}
	ownerGrow := grow
	if old.owner != owner { // owners are fixed at creation; this is a new session
		ownerGrow = n
	}
	if share := c.clientShareBytes(); share > 0 && owner != "" && l.owners[owner]+ownerGrow > share {
		return errShare(l.owners[owner], share)
	}
	return nil
}

// set records that session id, owned by owner, now takes n bytes.
func (l *ledger) set(id, owner string, n int64) {
	l.remove(id)
	l.sizes[id] = ledgerEntry{size: n, owner: owner}
	l.total += n
	if owner != "" {
		l.owners[owner] += n
	}
}

// remove forgets session id.
func (l *ledger) remove(id string) {
	e, ok := l.sizes[id]
	if !ok {
		return
	}
	delete(l.sizes, id)
	l.total -= e.size
	if e.owner != "" {
		if l.owners[e.owner] -= e.size; l.owners[e.owner] <= 0 {
			delete(l.owners, e.owner)
		}
	}
}

// recordBytes is the size a session counts for in the memory store: its
// JSON record and the 8-byte stamp, as bbolt stores it.
func recordBytes(s *Session) (int64, error) {
	j, err := json.Marshal(s)
	if err != nil {
		return 0, fmt.Errorf("encode session: %w", err)
	}
	return int64(stampLen + len(j)), nil
}

// roomChecker is a store that can tell, before a turn is generated, that
// storing it will be refused: the budget, or the share of the session's
// owner, has no room for need more bytes (the turn's input, which it will
// store at least). Only a hint: the commit checks again.
type roomChecker interface {
	Room(ctx context.Context, owner string, need int64) error
}

// room refuses a turn of a session of owner up front when the store has no
// room for it, so the client gets store_full before the reply is generated
// rather than after.
func (s *Service) room(ctx context.Context, owner string, need int) error {
	if r, ok := s.store.(roomChecker); ok {
		return r.Room(ctx, owner, int64(need))
	}
	return nil
}

// room is roomChecker's answer from a ledger.
func (l *ledger) room(c *storeConfig, owner string, need int64) error {
	if c.maxStoreBytes > 0 && l.total+need > c.maxStoreBytes {
		return errBudget(c.maxStoreBytes)
	}
	if share := c.clientShareBytes(); share > 0 && owner != "" && l.owners[owner]+need > share {
		return errShare(l.owners[owner], share)
	}
	return nil
}

// Room implements roomChecker.
func (m *MemoryStore) Room(_ context.Context, owner string, need int64) error {
	m.mu.Lock()
	err := m.led.room(&m.cfg, owner, need)
	m.mu.Unlock()
	m.refused.count(err)
	return err
}

// Room implements roomChecker.
func (b *BoltStore) Room(_ context.Context, owner string, need int64) error {
	b.mu.Lock()
	err := b.led.room(&b.cfg, owner, need)
	b.mu.Unlock()
	b.refused.count(err)
	return err
}

// Room implements roomChecker from the counts in Redis; when Redis cannot
// answer it says nothing (the commit will).
func (r *RedisStore) Room(ctx context.Context, owner string, need int64) error {
	share := r.cfg.clientShareBytes()
	pipe := r.rdb.Pipeline()
	total := pipe.Get(ctx, r.prefix+"bytes")
	held := pipe.HGet(ctx, r.prefix+"ob", owner)
	_, _ = pipe.Exec(ctx)
	var err error
	if n, rerr := total.Int64(); rerr == nil && r.cfg.maxStoreBytes > 0 && n+need > r.cfg.maxStoreBytes {
		err = errBudget(r.cfg.maxStoreBytes)
	} else if h, rerr := held.Int64(); rerr == nil && share > 0 && owner != "" && h+need > share {
		err = errShare(h, share)
	}
	r.refused.count(err)
	return err
}

// put stores sess through the Service's store. A write error that says
// the disk is full, from any Store (one of another package, a test's), is
// the client-safe store_full error rather than internal; this package's
// stores map their own already, and those pass as they are.
func (s *Service) put(ctx context.Context, sess *Session) error {
	err := s.store.Put(ctx, sess)
	if err != nil && parley.ErrorCode(err) == parley.EInternal && diskFull(err) {
		return errDiskFull("put session", err)
	}
	return err
}
