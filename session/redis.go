package session

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// ErrConflict is returned by RedisStore.Put when the stored session changed
// since the caller read it (another replica committed a turn in between).
// Nothing was written: re-read the session, reapply the change and Put
// again. The Service does so a bounded number of times; only when those
// retries are spent does a client see it (code busy: trying again works).
var ErrConflict = &parley.Error{Code: parley.EBusy,
	Message: "the session changed on another server at the same time; try again"}

// Redis client limits: a store that is down must fail a request within
// seconds with a clear error, not hang it; go-redis reconnects on the next
// command once the server is back.
const (
	redisDialTimeout = 2 * time.Second
	redisIOTimeout   = 3 * time.Second
	redisMaxRetries  = 1
	// redisExpirySlack is added to the TTL for Redis's own key expiry, the
	// safety net that frees memory even when no janitor runs. The store's
	// clock (Get and the janitor) decides expiry; Redis's must never act first.
	redisExpirySlack = time.Hour
	// redisLenTimeout bounds Len, which has no context.
	redisLenTimeout = time.Second
	// versionDigits is the width of a stored version: Unix nanoseconds,
	// zero padded, so Lua compares versions as strings (its numbers are
	// doubles and cannot hold nanoseconds exactly).
	versionDigits = 20
)

// putScript stores a session if its version is still the one the caller
// read (compare and set), then indexes it and evicts the least recently
// updated sessions over the bound, all in one atomic step.
//
//	KEYS[1] session hash, KEYS[2] index (sorted set id -> updated ms)
//	ARGV[1] expected version ("" = absent), ARGV[2] new version,
//	ARGV[3] index score, ARGV[4] record (JSON), ARGV[5] key expiry in ms
//	(0 = none), ARGV[6] max sessions (0 = no bound), ARGV[7] id,
//	ARGV[8] key prefix, ARGV[9] expiry cutoff version ("" = no TTL),
//	ARGV[10] owner ("" = none), ARGV[11] max sessions per owner (0 = no
//	bound), ARGV[12] eviction cutoff score ("" = evict any), ARGV[13]
//	expiry cutoff score ("" = no TTL), ARGV[14] byte budget (0 = none),
//	ARGV[15] one owner's share of it (0 = none), ARGV[16] user ("" = the
//	anonymous user)
//
// It returns {1, sessions stored} on success, {0, current version} on
// conflict, {2, oldest score} when the owner holds its maximum, {3,
// oldest score} when the store is full and none may be evicted, and {4,
// "budget" or "share", bytes held} when the byte budget refuses it. A
// session's owner is its hash's field o; the sorted set prefix+"o:"+owner
// indexes the owner's sessions by last update, as the index does all, and
// prefix+"u:"+user (field u) the user's, for UserSessions. The
// byte accounting is in redis_forget.lua.
// A session that has expired by the store's clock counts as absent.
//
//go:embed redis_put.lua
var putScriptSrc string

// expireScript deletes the sessions whose version is older than the cutoff.
//
//	KEYS[1] index; ARGV[1] cutoff score, ARGV[2] cutoff version,
//	ARGV[3] key prefix, ARGV[4] max sessions to delete
//
//go:embed redis_expire.lua
var expireScriptSrc string

// forgetScriptSrc is the byte accounting the other scripts share.
//
//go:embed redis_forget.lua
var forgetScriptSrc string

// deleteScript removes a session, its index entries and its bytes
// together. ARGV[1] id, ARGV[2] key prefix.
const deleteScriptSrc = `local o = redis.call('HGET', KEYS[1], 'o')
if o then redis.call('ZREM', ARGV[2] .. 'o:' .. o, ARGV[1]) end
local u = redis.call('HGET', KEYS[1], 'u')
if u then redis.call('ZREM', ARGV[2] .. 'u:' .. u, ARGV[1]) end
redis.call('DEL', KEYS[1]); redis.call('ZREM', KEYS[2], ARGV[1]); forget(ARGV[2], ARGV[1]); return 1`

// initBytesScript counts the bytes of sessions stored before the byte
// budget existed, once (when the total is absent), atomically, so replicas
// starting together count them once; a record's owner (field o) is charged
// its bytes. KEYS[1] index; ARGV[1] key prefix.
const initBytesScriptSrc = `
local pfx = ARGV[1]
if redis.call('EXISTS', pfx .. 'bytes') == 1 then return 0 end
local total = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local key = pfx .. 's:' .. id
  local n = redis.call('HSTRLEN', key, 'd')
  if n > 0 then
    redis.call('HSET', pfx .. 'sz', id, n)
    total = total + n
    local o = redis.call('HGET', key, 'o')
    if o and o ~= '' then
      redis.call('HSET', pfx .. 'ow', id, o)
      redis.call('HINCRBY', pfx .. 'ob', o, n)
    end
  end
end
redis.call('SET', pfx .. 'bytes', total)
return total`

// RedisStore keeps sessions in Redis (or Valkey), so that several Parley
// replicas share them: any replica resumes any session. Each session is a
// hash {v: version, d: JSON record}; a sorted set indexes ids by last
// update for eviction and expiry. Writes are optimistic: Put succeeds only
// if the session's version (its Updated time, strictly increasing per
// session) is the one the caller read, else it returns ErrConflict. A Put
// returns after Redis acknowledged it; durability beyond that is Redis's
// persistence setting (appendonly yes, appendfsync always for no loss).
type RedisStore struct {
	cfg    storeConfig
	jan    *janitor
	rdb    *redis.Client
	prefix string
	addr   string

	put, expire, del *redis.Script

	lastLen atomic.Int64 // Len's answer when Redis cannot be asked
	closed  atomic.Bool
	refused refusals
	// lastBytes is Usage's answer when Redis cannot be asked.
	lastBytes atomic.Int64
}

var (
	_ Store      = (*RedisStore)(nil)
	_ IDKeyStore = (*RedisStore)(nil)
	_ Admitter   = (*RedisStore)(nil)
	_ Lister     = (*RedisStore)(nil)
)

// OpenRedisStore connects to the Redis named by rawURL
// (redis://[user:password@]host:port/db, or rediss:// for TLS), checks that
// it answers, and starts the janitor. Keys start with prefix (e.g.
// "parley:"), so several deployments or tests can share one database.
func OpenRedisStore(ctx context.Context, rawURL, prefix string, opts ...StoreOption) (*RedisStore, error) {
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("session store: %w", err)
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = redisDialTimeout, redisIOTimeout, redisIOTimeout
	o.MaxRetries = redisMaxRetries
	o.DisableIdentity = true // no CLIENT SETINFO: older servers and Valkey builds refuse it noisily
	r := &RedisStore{
		cfg:    newStoreConfig(opts),
		rdb:    redis.NewClient(o),
		prefix: prefix,
		addr:   o.Addr,
		put:    redis.NewScript(forgetScriptSrc + putScriptSrc),
		expire: redis.NewScript(forgetScriptSrc + expireScriptSrc),
		del:    redis.NewScript(forgetScriptSrc + deleteScriptSrc),
	}
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("session store: redis at %s: %w", o.Addr, err), r.rdb.Close())
	}
	if err := redis.NewScript(initBytesScriptSrc).Run(ctx, r.rdb, []string{r.indexKey()}, r.prefix).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("session store: count stored bytes: %w", err), r.rdb.Close())
	}
	if n, err := r.rdb.ZCard(ctx, r.indexKey()).Result(); err == nil {
		r.lastLen.Store(n)
	}
	if r.cfg.ttl > 0 && r.cfg.interval > 0 {
		r.jan = startJanitor(r.cfg.interval, r.cfg.log.With(zap.String("store", "redis://"+o.Addr)), r.Expire)
	}
	return r, nil
}

// RedisLogger adapts a zap logger to the Redis client's logger (its pool
// reports failed dials this way). The client's logger is process-wide, so
// only main installs it: redis.SetLogger(session.RedisLogger{L: log}).
type RedisLogger struct{ L *zap.Logger }

// Printf implements the Redis client's Logging interface.
func (l RedisLogger) Printf(_ context.Context, format string, v ...any) {
	l.L.Warn(fmt.Sprintf(format, v...))
}

// IDKey implements IDKeyStore: the key is kept in Redis (made by the first
// replica that asks), so every replica reads the same response ids.
func (r *RedisStore) IDKey(ctx context.Context) ([]byte, error) {
	if r.closed.Load() {
		return nil, errClosed()
	}
	fresh := make([]byte, idKeyBytes)
	_, _ = rand.Read(fresh) // never fails (crypto/rand crashes rather than return an error)
	if err := r.rdb.SetNX(ctx, r.idKeyKey(), fresh, 0).Err(); err != nil {
		return nil, r.redisError("response id key", err)
	}
	k, err := r.rdb.Get(ctx, r.idKeyKey()).Bytes()
	if err != nil {
		return nil, r.redisError("response id key", err)
	}
	if len(k) != idKeyBytes {
		return nil, parley.Errorf(parley.EInternal, "the response id key in redis is %d bytes, want %d", len(k), idKeyBytes)
	}
	return k, nil
}

// Addr is the Redis server's host:port.
func (r *RedisStore) Addr() string { return r.addr }

func (r *RedisStore) indexKey() string            { return r.prefix + "idx" }
func (r *RedisStore) idKeyKey() string            { return r.prefix + "idkey" }
func (r *RedisStore) sessionKey(id string) string { return r.prefix + "s:" + id }

// version renders t as the store compares versions; the zero time is "".
func version(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return fmt.Sprintf("%0*d", versionDigits, t.UnixNano())
}

// Get implements Store.
func (r *RedisStore) Get(ctx context.Context, id string) (*Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.closed.Load() {
		return nil, errClosed()
	}
	if !ValidID(id) {
		return nil, errNotFound()
	}
	d, err := r.rdb.HGet(ctx, r.sessionKey(id), "d").Result()
	if errors.Is(err, redis.Nil) {
		return nil, errNotFound()
	} else if err != nil {
		return nil, r.redisError("get session", err)
	}
	var s Session
	if err := json.Unmarshal([]byte(d), &s); err != nil {
		return nil, fmt.Errorf("decode session: %w", err)
	}
	if r.cfg.expired(s.Updated, r.cfg.stamp()) {
		return nil, errNotFound()
	}
	return &s, nil
}

// Put implements Store. It stores s only if the stored session still has
// the version s was read with (s.Updated; zero for a session not stored
// yet), and returns ErrConflict otherwise, leaving s as it was. The new
// Updated is now, or one nanosecond past the version read when this
// replica's clock lags the writer's, so versions only ever increase.
func (r *RedisStore) Put(ctx context.Context, s *Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closed.Load() {
		return errClosed()
	}
	if s == nil {
		return parley.Errorf(parley.EInvalid, "no session to store")
	}
	read, created := s.Updated, s.Created
	cp, err := r.cfg.prepare(s)
	if err != nil {
		return err
	}
	if !read.IsZero() && !cp.Updated.After(read) {
		cp.Updated = read.Add(time.Nanosecond).Round(0).UTC()
		s.Updated = cp.Updated
	}
	rec, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("encode session: %w", err)
	}
	var keyTTL int64
	cutoff, scoreCutoff, evictCutoff := "", "", ""
	now := cp.Updated
	if r.cfg.ttl > 0 {
		keyTTL = (r.cfg.ttl + redisExpirySlack).Milliseconds()
		cutoff = version(now.Add(-r.cfg.ttl))
		scoreCutoff = fmt.Sprint(now.Add(-r.cfg.ttl).UnixMilli())
	}
	if r.cfg.evictFloor > 0 {
		// The newest update a session may have and still be evicted (see
		// storeConfig.evictable): idle past the floor, or expired.
		d := r.cfg.evictFloor
		if r.cfg.ttl > 0 && r.cfg.ttl < d {
			d = r.cfg.ttl
		}
		evictCutoff = fmt.Sprint(now.Add(-d).UnixMilli() - 1)
	}
	res, err := r.put.Run(ctx, r.rdb, []string{r.sessionKey(cp.ID), r.indexKey()},
		version(read), version(cp.Updated), cp.Updated.UnixMilli(), rec, keyTTL,
		max(r.cfg.maxSessions, 0), cp.ID, r.prefix, cutoff,
		cp.Owner, max(r.cfg.maxPerOwner, 0), evictCutoff, scoreCutoff,
		max(r.cfg.maxStoreBytes, 0), r.cfg.clientShareBytes(), cp.User).Slice()
	if err != nil {
		s.Updated, s.Created = read, created
		err = r.redisError("put session", err)
		r.refused.count(err)
		return err
	}
	switch code, _ := res[0].(int64); code {
	case 1:
	case 2, 3:
		s.Updated, s.Created = read, created
		var oldest time.Time
		if ms, err := strconv.ParseInt(fmt.Sprint(res[1]), 10, 64); err == nil {
			oldest = time.UnixMilli(ms).UTC()
		}
		if code == 2 {
			return r.cfg.errOwnerFull(oldest, now)
		}
		_, wait := r.cfg.evictable(oldest, now)
		return r.cfg.errStoreFull(wait)
	case 4:
		s.Updated, s.Created = read, created
		err = errBudget(r.cfg.maxStoreBytes)
		if why, _ := res[1].(string); why == "share" {
			held, _ := res[2].(int64)
			err = errShare(held, r.cfg.clientShareBytes())
		}
		r.refused.count(err)
		return err
	default:
		s.Updated, s.Created = read, created
		return ErrConflict
	}
	if n, ok := res[1].(int64); ok {
		r.lastLen.Store(n)
	}
	return nil
}

// Delete implements Store.
func (r *RedisStore) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closed.Load() {
		return errClosed()
	}
	if !ValidID(id) {
		return nil
	}
	if err := r.del.Run(ctx, r.rdb, []string{r.sessionKey(id), r.indexKey()}, id, r.prefix).Err(); err != nil {
		return r.redisError("delete session", err)
	}
	return nil
}

// Len implements Store: the sessions indexed in Redis (all replicas'). When
// Redis cannot answer within a second it returns the last count it saw.
func (r *RedisStore) Len() int {
	if r.closed.Load() {
		return int(r.lastLen.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisLenTimeout)
	defer cancel()
	if n, err := r.rdb.ZCard(ctx, r.indexKey()).Result(); err == nil {
		r.lastLen.Store(n)
	}
	return int(r.lastLen.Load())
}

// redisExpireBatch bounds the sessions one script run deletes, so a sweep of a
// large backlog does not block Redis for long.
const redisExpireBatch = 500

// Expire deletes the sessions that have expired by the store's clock and
// returns how many. Every replica's janitor may run it: the script is
// atomic, so each expired session is counted once.
func (r *RedisStore) Expire(ctx context.Context) (int, error) {
	if r.closed.Load() {
		return 0, errClosed()
	}
	if r.cfg.ttl <= 0 {
		return 0, nil
	}
	cut := r.cfg.stamp().Add(-r.cfg.ttl)
	total := 0
	for {
		n, err := r.expire.Run(ctx, r.rdb, []string{r.indexKey()},
			cut.UnixMilli(), version(cut), r.prefix, redisExpireBatch).Int()
		if err != nil {
			return total, r.redisError("expire sessions", err)
		}
		total += n
		if n < redisExpireBatch {
			return total, nil
		}
	}
}

// Close implements Store.
func (r *RedisStore) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.jan.stop()
	if err := r.rdb.Close(); err != nil {
		return fmt.Errorf("close session store: %w", err)
	}
	return nil
}

// redisError turns a failed Redis call into an error a client can read
// (code unavailable: the store is down or unreachable, and trying again
// later works), keeping the cause for the log.
func (r *RedisStore) redisError(op string, err error) error {
	if r.closed.Load() || errors.Is(err, redis.ErrClosed) {
		return errClosed()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if redisFull(err) {
		return errDiskFull(op, err)
	}
	return &storeError{op: op, cause: err,
		safe: parley.Errorf(parley.EUnavailable, "the session store is unavailable; try again shortly")}
}

// storeError is a client-safe parley error (safe, what errors.As finds)
// that keeps its cause for logs.
type storeError struct {
	safe  *parley.Error
	op    string
	cause error
}

func (e *storeError) Error() string   { return e.op + ": " + e.cause.Error() }
func (e *storeError) Unwrap() []error { return []error{e.safe, e.cause} }

// Admit implements Admitter (two reads; the put script decides).
func (r *RedisStore) Admit(ctx context.Context, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closed.Load() {
		return errClosed()
	}
	now := r.cfg.stamp()
	oldest := func(key string) (time.Time, error) {
		zs, err := r.rdb.ZRangeWithScores(ctx, key, 0, 0).Result()
		if err != nil || len(zs) == 0 {
			return time.Time{}, err
		}
		return time.UnixMilli(int64(zs[0].Score)).UTC(), nil
	}
	if owner != "" && r.cfg.maxPerOwner > 0 {
		okey, low := r.prefix+"o:"+owner, "-inf"
		if r.cfg.ttl > 0 {
			low = fmt.Sprint(now.Add(-r.cfg.ttl).UnixMilli())
		}
		n, err := r.rdb.ZCount(ctx, okey, low, "+inf").Result()
		if err != nil {
			return r.redisError("admit session", err)
		}
		if n >= int64(r.cfg.maxPerOwner) {
			t, err := oldest(okey)
			if err != nil {
				return r.redisError("admit session", err)
			}
			return r.cfg.errOwnerFull(t, now)
		}
	}
	if r.cfg.maxSessions > 0 {
		n, err := r.rdb.ZCard(ctx, r.indexKey()).Result()
		if err != nil {
			return r.redisError("admit session", err)
		}
		if n >= int64(r.cfg.maxSessions) {
			t, err := oldest(r.indexKey())
			if err != nil {
				return r.redisError("admit session", err)
			}
			if ok, wait := r.cfg.evictable(t, now); !ok {
				return r.cfg.errStoreFull(wait)
			}
		}
	}
	return nil
}

// Usage implements UsageReporter: the bytes all replicas stored. When Redis
// cannot answer within a second it reports the last total it saw.
func (r *RedisStore) Usage() Usage {
	u := Usage{Budget: max(r.cfg.maxStoreBytes, 0), ClientShare: r.cfg.clientShareBytes()}
	if !r.closed.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), redisLenTimeout)
		defer cancel()
		if n, err := r.rdb.Get(ctx, r.prefix+"bytes").Int64(); err == nil || errors.Is(err, redis.Nil) {
			r.lastBytes.Store(n)
		}
	}
	u.Bytes = r.lastBytes.Load()
	r.refused.fill(&u)
	return u
}

// ClientBytes implements UsageReporter (0 when Redis cannot answer).
func (r *RedisStore) ClientBytes(key string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), redisLenTimeout)
	defer cancel()
	n, _ := r.rdb.HGet(ctx, r.prefix+"ob", key).Int64()
	return n
}

// UserSessions implements Lister: the user's sorted set, newest first. It
// may still name sessions Redis expired by itself (Get finds them gone).
func (r *RedisStore) UserSessions(ctx context.Context, user string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.closed.Load() {
		return nil, errClosed()
	}
	ids, err := r.rdb.ZRevRange(ctx, r.prefix+"u:"+user, 0, -1).Result()
	if err != nil {
		return nil, r.redisError("list sessions", err)
	}
	return ids, nil
}
