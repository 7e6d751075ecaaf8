package session

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// The bolt file holds two buckets, written only together in one transaction:
//
//	sessions: id -> stamp(updated) || JSON(Session)
//	updated:  stamp(updated) || id -> empty
//
// stamp is 8 bytes that sort like the time they encode, so the updated
// index iterates from the least recently updated session: the first to
// evict and to expire. The record carries its own stamp so that replacing a
// session finds its old index key without decoding JSON.
var (
	bucketSessions = []byte("sessions")
	bucketUpdated  = []byte("updated")
	// owners: id -> the client key that created the session (budget.go);
	// absent for sessions without one. Written with the other two.
	bucketOwners = []byte("owners")
)

const (
	stampLen = 8
	// openTimeout bounds the wait for the file lock, so a second server on
	// the same data directory fails at once with a clear error instead of hanging.
	openTimeout = 2 * time.Second
	// expireBatch bounds the sessions one expiry transaction deletes, so a
	// large sweep does not hold the single writer for long.
	expireBatch = 1000
)

// BoltStore keeps sessions in a bbolt file. Every Put is committed and
// fsynced before it returns, and the file survives kill -9 (bbolt writes
// copy-on-write pages and flips a meta page last). One process at a time
// may open a file.
type BoltStore struct {
	cfg  storeConfig
	db   *bolt.DB
	path string
	jan  *janitor

	// mu serializes writers (bbolt allows one write transaction at a time
	// anyway) so count is exact inside a write: it changes only under mu,
	// after a commit succeeded. Readers use count without mu.
	mu     sync.Mutex
	count  atomic.Int64
	closed atomic.Bool
	// led counts the bytes of every stored record (budget.go); guarded by
	// mu, changed only after a commit succeeded, like count.
	led     *ledger
	refused refusals
}

var _ Store = (*BoltStore)(nil)

// OpenBoltStore opens (creating it and its directory when missing) the
// session file at path and starts its janitor; Close stops it and closes the
// file.
func OpenBoltStore(path string, opts ...StoreOption) (*BoltStore, error) {
	cfg := newStoreConfig(opts)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open session store: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Size() == 0 {
		// bbolt would take an empty file for a new one and start afresh
		// silently; an empty file where sessions were is damage.
		return nil, damaged(path, errors.New("the file is empty (0 bytes)"))
	}
	db, err := openChecked(path, &bolt.Options{Timeout: openTimeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open session store %s: locked by another process: %w", path, err)
	} else if err != nil {
		return nil, err
	}
	if db, err = compactWasteful(db, path, cfg.log); err != nil {
		return nil, err
	}
	b := &BoltStore{cfg: cfg, db: db, path: path, led: newLedger()}
	err = safely(func() error {
		return db.Update(func(tx *bolt.Tx) error {
			s, err := tx.CreateBucketIfNotExists(bucketSessions)
			if err != nil {
				return err
			}
			if _, err := tx.CreateBucketIfNotExists(bucketUpdated); err != nil {
				return err
			}
			o, err := tx.CreateBucketIfNotExists(bucketOwners)
			if err != nil {
				return err
			}
			b.count.Store(int64(s.Stats().KeyN))
			return b.loadLedger(s, o)
		})
	})
	if err != nil {
		return nil, errors.Join(damaged(path, err), db.Close())
	}
	if cfg.ttl > 0 && cfg.interval > 0 {
		b.jan = startJanitor(cfg.interval, cfg.log.With(zap.String("store", path)), b.Expire)
	}
	return b, nil
}

// Path is the file the store keeps its sessions in.
func (b *BoltStore) Path() string { return b.path }

// Get implements Store.
func (b *BoltStore) Get(ctx context.Context, id string) (*Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, errClosed()
	}
	if !ValidID(id) {
		return nil, errNotFound()
	}
	var s *Session
	err := b.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketSessions).Get([]byte(id))
		if v == nil {
			return nil
		}
		var err error
		s, err = decodeRecord(v)
		return err
	})
	if err != nil {
		return nil, b.dbError("get session", err)
	}
	if s == nil || b.cfg.expired(s.Updated, b.cfg.stamp()) {
		return nil, errNotFound()
	}
	return s, nil
}

// Put implements Store.
func (b *BoltStore) Put(ctx context.Context, s *Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return errClosed()
	}
	cp, err := b.cfg.prepare(s)
	if err != nil {
		return err
	}
	val, err := encodeRecord(cp)
	if err != nil {
		return err
	}
	id := []byte(cp.ID)
	client := ClientOf(ctx)
	if err := b.led.check(&b.cfg, cp.ID, client, int64(len(val))); err != nil {
		b.refused.count(err)
		return err
	}
	owner := b.led.owner(cp.ID, client)
	count := b.count.Load()
	var evicted []string
	err = b.db.Update(func(tx *bolt.Tx) error {
		sessions, updated := tx.Bucket(bucketSessions), tx.Bucket(bucketUpdated)
		if old := sessions.Get(id); old != nil {
			if len(old) >= stampLen {
				if err := updated.Delete(indexKey(old[:stampLen], id)); err != nil {
					return err
				}
			}
		} else {
			c := updated.Cursor()
			for k, _ := c.First(); k != nil && b.cfg.maxSessions > 0 && count >= int64(b.cfg.maxSessions); k, _ = c.First() {
				evicted = append(evicted, string(k[stampLen:]))
				if err := deleteIndexed(sessions, updated, k); err != nil {
					return err
				}
				count--
			}
			count++
			if owner != "" {
				if err := tx.Bucket(bucketOwners).Put(id, []byte(owner)); err != nil {
					return err
				}
			}
		}
		if err := sessions.Put(id, val); err != nil {
			return err
		}
		return updated.Put(indexKey(val[:stampLen], id), nil)
	})
	if err != nil {
		err = b.dbError("put session", err)
		b.refused.count(err)
		return err
	}
	b.count.Store(count)
	for _, e := range evicted {
		b.led.remove(e)
	}
	b.led.set(cp.ID, client, int64(len(val)))
	if len(evicted) > 0 {
		b.cfg.log.Debug("evicted least recently updated sessions", zap.Int("count", len(evicted)))
	}
	return nil
}

// Delete implements Store.
func (b *BoltStore) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return errClosed()
	}
	count := b.count.Load()
	err := b.db.Update(func(tx *bolt.Tx) error {
		sessions, updated := tx.Bucket(bucketSessions), tx.Bucket(bucketUpdated)
		old := sessions.Get([]byte(id))
		if old == nil {
			return nil
		}
		if len(old) >= stampLen {
			if err := updated.Delete(indexKey(old[:stampLen], []byte(id))); err != nil {
				return err
			}
		}
		count--
		if err := tx.Bucket(bucketOwners).Delete([]byte(id)); err != nil {
			return err
		}
		return sessions.Delete([]byte(id))
	})
	if err != nil {
		return b.dbError("delete session", err)
	}
	b.count.Store(count)
	b.led.remove(id)
	return nil
}

// Len implements Store.
func (b *BoltStore) Len() int { return int(b.count.Load()) }

// Expire deletes every expired session now and returns how many it deleted.
// The janitor calls it every interval.
func (b *BoltStore) Expire(ctx context.Context) (int, error) {
	if b.cfg.ttl <= 0 {
		return 0, nil
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := b.expireBatch()
		total += n
		if err != nil || n < expireBatch {
			return total, err
		}
	}
}

// expireBatch deletes up to expireBatch expired sessions in one transaction.
func (b *BoltStore) expireBatch() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed()
	}
	now := b.cfg.stamp()
	count := b.count.Load()
	n := 0
	var keys [][]byte
	err := b.db.Update(func(tx *bolt.Tx) error {
		sessions, updated := tx.Bucket(bucketSessions), tx.Bucket(bucketUpdated)
		// Collect first: deleting under a moving cursor can skip keys.
		keys = keys[:0]
		c := updated.Cursor()
		for k, _ := c.First(); k != nil && len(keys) < expireBatch; k, _ = c.Next() {
			if len(k) < stampLen || !b.cfg.expired(decodeStamp(k[:stampLen]), now) {
				break
			}
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := deleteIndexed(sessions, updated, k); err != nil {
				return err
			}
		}
		n = len(keys)
		return nil
	})
	if err != nil {
		return 0, b.dbError("expire sessions", err)
	}
	b.count.Store(count - int64(n))
	for _, k := range keys {
		b.led.remove(string(k[stampLen:]))
	}
	return n, nil
}

// Close implements Store. It is safe to call more than once.
func (b *BoltStore) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.jan.stop()
	b.mu.Lock() // wait for a write in progress
	defer b.mu.Unlock()
	if err := b.db.Close(); err != nil {
		return fmt.Errorf("close session store: %w", err)
	}
	return nil
}

// dbError turns bbolt's "closed" into the store's own error and wraps the rest.
func (b *BoltStore) dbError(op string, err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) || b.closed.Load() {
		return errClosed()
	}
	if diskFull(err) {
		return errDiskFull(op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// deleteIndexed removes the session an updated-index key points at, its
// owner, and the key.
func deleteIndexed(sessions, updated *bolt.Bucket, k []byte) error {
	if err := sessions.Delete(k[stampLen:]); err != nil {
		return err
	}
	if o := sessions.Tx().Bucket(bucketOwners); o != nil {
		if err := o.Delete(k[stampLen:]); err != nil {
			return err
		}
	}
	return updated.Delete(k)
}

// loadLedger counts the bytes of every stored record and their owners.
func (b *BoltStore) loadLedger(sessions, owners *bolt.Bucket) error {
	own := map[string]string{}
	if err := owners.ForEach(func(k, v []byte) error {
		own[string(k)] = string(v)
		return nil
	}); err != nil {
		return err
	}
	return sessions.ForEach(func(k, v []byte) error {
		b.led.set(string(k), own[string(k)], int64(len(v)))
		return nil
	})
}

// Usage implements UsageReporter.
func (b *BoltStore) Usage() Usage {
	b.mu.Lock()
	u := Usage{Bytes: b.led.total, Budget: max(b.cfg.maxStoreBytes, 0), ClientShare: b.cfg.clientShareBytes()}
	b.mu.Unlock()
	b.refused.fill(&u)
	return u
}

// ClientBytes implements UsageReporter.
func (b *BoltStore) ClientBytes(key string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.led.owners[key]
}

func indexKey(stamp, id []byte) []byte {
	k := make([]byte, 0, len(stamp)+len(id))
	return append(append(k, stamp...), id...)
}

// encodeStamp maps a time to 8 bytes whose byte order is the time order:
// Unix nanoseconds with the sign bit flipped, big endian.
func encodeStamp(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())^(1<<63))
}

func decodeStamp(b []byte) time.Time {
	return time.Unix(0, int64(binary.BigEndian.Uint64(b)^(1<<63))).UTC()
}

func encodeRecord(s *Session) ([]byte, error) {
	j, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode session: %w", err)
	}
	return append(encodeStamp(s.Updated), j...), nil
}

// decodeRecord decodes a record; v may be memory of a read transaction, so
// nothing in the result refers to it.
func decodeRecord(v []byte) (*Session, error) {
	if len(v) < stampLen {
		return nil, parley.Errorf(parley.EInternal, "session record is truncated")
	}
	var s Session
	if err := json.Unmarshal(v[stampLen:], &s); err != nil {
		return nil, fmt.Errorf("decode session: %w", err)
	}
	return &s, nil
}
