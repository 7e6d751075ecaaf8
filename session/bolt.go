package session

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// The bolt file holds these buckets, written only together in one transaction:
//
//	sessions: id -> stamp(updated) || JSON(Session)
//	updated:  stamp(updated) || id -> empty
//	owners:   id -> Session.Owner (sessions with an owner only)
//	owned:    Owner || 0x00 || id -> stamp(updated) (the same sessions)
//	userof:   id -> "u" || Session.User (every session; the prefix keeps "" non-empty)
//	byuser:   User || 0x00 || id -> stamp(updated) (the same sessions)
//	meta:     "response-id-key" -> the key of response ids (IDKeyStore)
//
// stamp is 8 bytes that sort like the time they encode, so the updated
// index iterates from the least recently updated session: the first to
// evict and to expire. The record carries its own stamp so that replacing a
// session finds its old index key without decoding JSON.
//
// owners and owned let a Put count an owner's sessions (a prefix scan of
// at most the per-owner cap) and find their owner when a session is
// deleted, evicted or expired, without decoding records; owners also tells
// whose share of the byte budget each record counts against when the file
// is opened (budget.go). Files written before them have sessions without
// owners, which no owner counts. userof and byuser list a user's sessions
// (UserSessions) the same way; a file written before them gets them built
// from its records when it is opened.
var (
	bucketSessions = []byte("sessions")
	bucketUpdated  = []byte("updated")
	bucketOwners   = []byte("owners")
	bucketOwned    = []byte("owned")
	bucketUserOf   = []byte("userof")
	bucketByUser   = []byte("byuser")
	bucketMeta     = []byte("meta")
	keyIDKey       = []byte("response-id-key")
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
	idKey  []byte // response ids' key, read or made at open
	// led counts the bytes of every stored record (budget.go); guarded by
	// mu, changed only after a commit succeeded, like count.
	led     *ledger
	refused refusals
}

var (
	_ Store      = (*BoltStore)(nil)
	_ IDKeyStore = (*BoltStore)(nil)
	_ Admitter   = (*BoltStore)(nil)
	_ Lister     = (*BoltStore)(nil)
)

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
			for _, name := range [][]byte{bucketUpdated, bucketOwners, bucketOwned} {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			if err := indexUsers(tx); err != nil {
				return err
			}
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			if k := meta.Get(keyIDKey); len(k) == idKeyBytes {
				b.idKey = bytes.Clone(k)
			} else {
				b.idKey = make([]byte, idKeyBytes)
				_, _ = rand.Read(b.idKey) // never fails (crypto/rand crashes rather than return an error)
				if err := meta.Put(keyIDKey, b.idKey); err != nil {
					return err
				}
			}
			b.count.Store(int64(s.Stats().KeyN))
			return b.loadLedger(s, tx.Bucket(bucketOwners))
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

// IDKey implements IDKeyStore: the key kept in the file.
func (b *BoltStore) IDKey(context.Context) ([]byte, error) { return b.idKey, nil }

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
	if err := b.led.check(&b.cfg, cp.ID, cp.Owner, int64(len(val))); err != nil {
		b.refused.count(err)
		return err
	}
	count := b.count.Load()
	var evicted []string
	var refused error // a parley error that rolls the transaction back
	err = b.db.Update(func(tx *bolt.Tx) error {
		sessions, updated := tx.Bucket(bucketSessions), tx.Bucket(bucketUpdated)
		if old := sessions.Get(id); old != nil {
			if len(old) >= stampLen {
				if err := updated.Delete(indexKey(old[:stampLen], id)); err != nil {
					return err
				}
			}
			if err := dropOwner(tx, id); err != nil {
				return err
			}
		} else {
			if refused = b.ownerFull(tx, cp.Owner, cp.Updated); refused != nil {
				return refused
			}
			c := updated.Cursor()
			for k, _ := c.First(); k != nil && b.cfg.maxSessions > 0 && count >= int64(b.cfg.maxSessions); k, _ = c.First() {
				if len(k) >= stampLen {
					if ok, wait := b.cfg.evictable(decodeStamp(k[:stampLen]), cp.Updated); !ok {
						refused = b.cfg.errStoreFull(wait)
						return refused
					}
				}
				evicted = append(evicted, string(k[stampLen:]))
				if err := deleteIndexed(tx, k); err != nil {
					return err
				}
				count--
			}
			count++
		}
		if err := sessions.Put(id, val); err != nil {
			return err
		}
		if err := addOwner(tx, cp.Owner, id, val[:stampLen]); err != nil {
			return err
		}
		if err := addUser(tx, cp.User, id, val[:stampLen]); err != nil {
			return err
		}
		return updated.Put(indexKey(val[:stampLen], id), nil)
	})
	if refused != nil && errors.Is(err, refused) {
		return refused
	}
	if err != nil {
		err = b.dbError("put session", err)
		b.refused.count(err)
		return err
	}
	b.count.Store(count)
	for _, e := range evicted {
		b.led.remove(e)
	}
	b.led.set(cp.ID, cp.Owner, int64(len(val)))
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
		if err := dropOwner(tx, []byte(id)); err != nil {
			return err
		}
		count--
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
		updated := tx.Bucket(bucketUpdated)
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
			if err := deleteIndexed(tx, k); err != nil {
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
// owner entries, and the key.
func deleteIndexed(tx *bolt.Tx, k []byte) error {
	id := k[stampLen:]
	if err := dropOwner(tx, id); err != nil {
		return err
	}
	if err := tx.Bucket(bucketSessions).Delete(id); err != nil {
		return err
	}
	return tx.Bucket(bucketUpdated).Delete(k)
}

// ownedKey is id's key in the owned bucket.
func ownedKey(owner, id []byte) []byte {
	k := make([]byte, 0, len(owner)+1+len(id))
	return append(append(append(k, owner...), 0), id...)
}

// dropOwner removes session id's owner and user entries, if it has any.
func dropOwner(tx *bolt.Tx, id []byte) error {
	if err := dropUser(tx, id); err != nil {
		return err
	}
	owners := tx.Bucket(bucketOwners)
	owner := owners.Get(id)
	if owner == nil {
		return nil
	}
	if err := tx.Bucket(bucketOwned).Delete(ownedKey(owner, id)); err != nil {
		return err
	}
	return owners.Delete(id)
}

// addOwner records session id under owner ("" records nothing).
func addOwner(tx *bolt.Tx, owner string, id, stamp []byte) error {
	if owner == "" {
		return nil
	}
	if err := tx.Bucket(bucketOwners).Put(id, []byte(owner)); err != nil {
		return err
	}
	return tx.Bucket(bucketOwned).Put(ownedKey([]byte(owner), id), stamp)
}

// ownerFull returns errOwnerFull when owner already holds maxPerOwner
// sessions; it reads at most that many keys.
func (b *BoltStore) ownerFull(tx *bolt.Tx, owner string, now time.Time) error {
	limit := b.cfg.maxPerOwner
	if owner == "" || limit <= 0 {
		return nil
	}
	prefix := append([]byte(owner), 0)
	n := 0
	var oldest []byte
	c := tx.Bucket(bucketOwned).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(v) == stampLen && (oldest == nil || bytes.Compare(v, oldest) < 0) {
			oldest = v
		}
		if n++; n >= limit {
			var t time.Time
			if oldest != nil {
				t = decodeStamp(oldest)
			}
			return b.cfg.errOwnerFull(t, now)
		}
	}
	return nil
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

// Admit implements Admitter.
func (b *BoltStore) Admit(ctx context.Context, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.closed.Load() {
		return errClosed()
	}
	now := b.cfg.stamp()
	var refused error
	err := b.db.View(func(tx *bolt.Tx) error {
		if refused = b.ownerFull(tx, owner, now); refused != nil {
			return nil
		}
		if b.cfg.maxSessions > 0 && b.count.Load() >= int64(b.cfg.maxSessions) {
			if k, _ := tx.Bucket(bucketUpdated).Cursor().First(); len(k) >= stampLen {
				if ok, wait := b.cfg.evictable(decodeStamp(k[:stampLen]), now); !ok {
					refused = b.cfg.errStoreFull(wait)
				}
			}
		}
		return nil
	})
	if err != nil {
		return b.dbError("admit session", err)
	}
	return refused
}

// indexUsers creates the user buckets; when they are new (a file written
// before users existed), it indexes every stored session under its user.
func indexUsers(tx *bolt.Tx) error {
	if tx.Bucket(bucketByUser) != nil && tx.Bucket(bucketUserOf) != nil {
		return nil
	}
	for _, name := range [][]byte{bucketUserOf, bucketByUser} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
		s, err := decodeRecord(v)
		if err != nil {
			return nil // a record that does not decode is nobody's to list
		}
		return addUser(tx, s.User, bytes.Clone(k), v[:stampLen])
	})
}

// addUser records session id under user (every session has one; "" is the
// anonymous user).
func addUser(tx *bolt.Tx, user string, id, stamp []byte) error {
	if err := tx.Bucket(bucketUserOf).Put(id, append([]byte{'u'}, user...)); err != nil {
		return err
	}
	return tx.Bucket(bucketByUser).Put(ownedKey([]byte(user), id), stamp)
}

// dropUser removes session id's user entries, if it has any.
func dropUser(tx *bolt.Tx, id []byte) error {
	userOf := tx.Bucket(bucketUserOf)
	if userOf == nil {
		return nil // a file being repaired (RepairBoltFile) has none yet
	}
	u := userOf.Get(id)
	if len(u) == 0 {
		return nil
	}
	if err := tx.Bucket(bucketByUser).Delete(ownedKey(u[1:], id)); err != nil {
		return err
	}
	return userOf.Delete(id)
}

// UserSessions implements Lister: a prefix scan of the user's index, newest first.
func (b *BoltStore) UserSessions(ctx context.Context, user string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, errClosed()
	}
	type entry struct {
		id    string
		stamp []byte
	}
	var found []entry
	prefix := append([]byte(user), 0)
	err := b.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketByUser).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			found = append(found, entry{string(k[len(prefix):]), bytes.Clone(v)})
		}
		return nil
	})
	if err != nil {
		return nil, b.dbError("list sessions", err)
	}
	slices.SortStableFunc(found, func(x, y entry) int { return bytes.Compare(y.stamp, x.stamp) })
	ids := make([]string, len(found))
	for i, e := range found {
		ids[i] = e.id
	}
	return ids, nil
}
