// Package kvredis is a kvcache.Tier in Redis (or Valkey): the KV states of
// conversations, shared by every replica that reaches the same server, so
// any of them restores a conversation another served. It is the only code
// of the KV cache that imports the Redis client.
//
// Keys, under a prefix and a folder per identity (a hash of the model,
// llama.cpp build and KV layout the states are valid for):
//
//	e:<key>   hash {h: header (kvcache.EncodeHeader), b: the entry (kvcache.Encode), n: its bytes,
//	          o: its owner (parley.ScopeOwner of the key)}
//	lru       sorted set key -> clock (the last write or read)
//	u:<owner> sorted set key -> clock, of the owner's entries
//	owners    sorted set owner -> the bytes of the owner's entries
//	bytes     the bytes of the identity's entries
//	clock     a counter: the order of uses, the same for every replica
//
// A write and the evictions it causes are one transaction (MULTI: a script
// that charges the bytes and evicts, then the state's HSET), so replicas
// writing together keep the budget; a read marks its entry used. The state
// itself never passes through a script: Lua copies a value in and out, which
// made a 1 MiB read take three times a plain HGET's time.
package kvredis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/kvcache"
)

// Client limits: a state is up to tens of MiB, read or written in one
// command; a server that is down must fail the call at once (no retries:
// the cache leaves the tier alone for a while and the turn is evaluated).
const (
	dialTimeout = time.Second
	ioTimeout   = 30 * time.Second
	// maxValue is the largest value Redis stores (proto-max-bulk-len's
	// default): a larger state is refused as full, not sent.
	maxValue = 512 << 20
)

// putScript stores an entry's header, size and owner, charges its bytes
// and evicts past the budget (never the entry it writes); the HSET of the
// entry's state follows it in the same MULTI. Evictions are fair between
// users: the victim is the least recently used entry of the user who holds
// the most bytes (kvcache.Tier), so one user's writes evict another's
// states only while that user holds more.
//
//	KEYS[1] entry, KEYS[2] lru, KEYS[3] bytes, KEYS[4] clock, KEYS[5] owners,
//	KEYS[6] the owner's lru
//	ARGV[1] key, ARGV[2] header, ARGV[3] owner, ARGV[4] its bytes,
//	ARGV[5] budget, ARGV[6] entry key prefix, ARGV[7] owner lru prefix
//
// Returns {bytes held, entries, evicted}.
const putScript = `
local n = tonumber(ARGV[4])
local old = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
redis.call('HSET', KEYS[1], 'h', ARGV[2], 'n', n, 'o', ARGV[3])
local total = redis.call('INCRBY', KEYS[3], n - old)
redis.call('ZINCRBY', KEYS[5], n - old, ARGV[3])
local clock = redis.call('INCR', KEYS[4])
redis.call('ZADD', KEYS[2], clock, ARGV[1])
redis.call('ZADD', KEYS[6], clock, ARGV[1])
local budget = tonumber(ARGV[5])
local evicted = 0
while total > budget do
  local victim, list
  for _, o in ipairs(redis.call('ZREVRANGE', KEYS[5], 0, 1)) do
    list = ARGV[7] .. o
    local oldest = redis.call('ZRANGE', list, 0, 1)
    victim = oldest[1]
    if victim == ARGV[1] then victim = oldest[2] end
    if victim then break end
  end
  if not victim then break end
  local ek = ARGV[6] .. victim
  local size = tonumber(redis.call('HGET', ek, 'n') or '0')
  local owner = redis.call('HGET', ek, 'o') or ''
  redis.call('DEL', ek)
  redis.call('ZREM', KEYS[2], victim)
  redis.call('ZREM', list, victim)
  if ARGV[7] .. owner ~= list then redis.call('ZREM', ARGV[7] .. owner, victim) end
  if tonumber(redis.call('ZINCRBY', KEYS[5], -size, owner)) <= 0 then redis.call('ZREM', KEYS[5], owner) end
  total = redis.call('DECRBY', KEYS[3], size)
  evicted = evicted + 1
end
return {total, redis.call('ZCARD', KEYS[2]), evicted}`

// touchScript marks an entry used, when it is still there; the HGET of
// its state goes before it in the same round trip.
//
//	KEYS[1] lru, KEYS[2] clock, KEYS[3] the owner's lru; ARGV[1] key
const touchScript = `
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local clock = redis.call('INCR', KEYS[2])
  redis.call('ZADD', KEYS[1], 'XX', clock, ARGV[1])
  redis.call('ZADD', KEYS[3], 'XX', clock, ARGV[1])
end
return 0`

// dropScript removes an entry that failed its checks, and its bytes when
// they were counted (an entry put there by other means never was).
//
//	KEYS[1] entry, KEYS[2] lru, KEYS[3] bytes, KEYS[4] owners; ARGV[1] key,
//	ARGV[2] owner lru prefix
const dropScript = `
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local owner = redis.call('HGET', KEYS[1], 'o') or ''
redis.call('DEL', KEYS[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('DECRBY', KEYS[3], n)
  redis.call('ZREM', ARGV[2] .. owner, ARGV[1])
  if tonumber(redis.call('ZINCRBY', KEYS[4], -n, owner)) <= 0 then redis.call('ZREM', KEYS[4], owner) end
end
return n`

// Tier is the Redis tier. Safe for concurrent use.
type Tier struct {
	rdb    *redis.Client
	addr   string
	prefix string
	budget int64
	log    *zap.Logger

	put, touch, drop *redis.Script

	mu    sync.Mutex
	usage map[string][2]int64 // by identity: bytes and entries as the last write saw them
}

var _ kvcache.Tier = (*Tier)(nil)

// Open returns a Tier on the Redis named by rawURL
// (redis://[user:password@]host:port/db, rediss:// for TLS) that keeps each
// identity's states within budget bytes, under keys that start with prefix
// (e.g. "parley:kv:"). A server that does not answer now is logged, not an
// error: the tier is tried again on use, and until then turns that move
// between replicas are evaluated again.
func Open(ctx context.Context, rawURL, prefix string, budget int64, log *zap.Logger) (*Tier, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("kv shared tier: want a byte budget above 0, got %d", budget)
	}
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("kv shared tier: %w", err)
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
	o.MaxRetries = -1 // none: a failure falls back to evaluating the turn
	o.DisableIdentity = true
	if log == nil {
		log = zap.NewNop()
	}
	t := &Tier{rdb: redis.NewClient(o), addr: o.Addr, prefix: prefix, budget: budget, log: log,
		put: redis.NewScript(putScript), touch: redis.NewScript(touchScript), drop: redis.NewScript(dropScript),
		usage: map[string][2]int64{}}
	if err := t.rdb.Ping(ctx).Err(); err != nil {
		log.Warn("kv shared tier: redis does not answer; it is tried again on use", zap.String("redis", o.Addr), zap.Error(err))
	}
	return t, nil
}

// Close closes the client.
func (t *Tier) Close() error { return t.rdb.Close() }

func (t *Tier) String() string { return "redis " + t.addr }

// keys returns the prefix of identity's keys.
func (t *Tier) keys(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return t.prefix + hex.EncodeToString(sum[:8]) + ":"
}

// Put implements kvcache.Tier.
func (t *Tier) Put(ctx context.Context, identity string, e *kvcache.Entry) (int64, error) {
	data := kvcache.Encode(identity, e)
	n := int64(len(data))
	if n > t.budget || n > maxValue {
		return 0, fmt.Errorf("%w: a state of %d bytes, the budget is %d", kvcache.ErrTierFull, n, t.budget)
	}
	p := t.keys(identity)
	owner := parley.ScopeOwner(e.Key)
	var acct *redis.Cmd
	_, err := t.rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		// EVAL, not EVALSHA: a script Redis forgot (a restart) cannot fail
		// the transaction, and its text is little beside the state.
		acct = t.put.Eval(ctx, tx, []string{p + "e:" + e.Key, p + "lru", p + "bytes", p + "clock", p + "owners", p + "u:" + owner},
			e.Key, kvcache.EncodeHeader(identity, e), owner, n, t.budget, p+"e:", p+"u:")
		tx.HSet(ctx, p+"e:"+e.Key, "b", data)
		return nil
	})
	if err != nil {
		if isOOM(err) || isOOM(acct.Err()) {
			return 0, fmt.Errorf("%w: %v", kvcache.ErrTierFull, err)
		}
		return 0, fmt.Errorf("redis %s: %w", t.addr, err)
	}
	res, err := acct.Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("redis %s: %w", t.addr, err)
	}
	if len(res) == 3 {
		t.mu.Lock()
		t.usage[identity] = [2]int64{res[0], res[1]}
		t.mu.Unlock()
		if res[2] > 0 {
			t.log.Debug("kv shared tier: states evicted for room", zap.Int64("evicted", res[2]), zap.Int64("bytes", res[0]))
		}
	}
	return n, nil
}

// Get implements kvcache.Tier: the state's HGET and the script that marks
// it used, in one round trip.
func (t *Tier) Get(ctx context.Context, identity, key string) (*kvcache.Entry, error) {
	p := t.keys(identity)
	var get *redis.StringCmd
	_, err := t.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		get = pl.HGet(ctx, p+"e:"+key, "b")
		t.touch.Eval(ctx, pl, []string{p + "lru", p + "clock", p + "u:" + parley.ScopeOwner(key)}, key)
		return nil
	})
	if errors.Is(err, redis.Nil) || (err == nil && errors.Is(get.Err(), redis.Nil)) {
		return nil, kvcache.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", t.addr, err)
	}
	data, err := get.Bytes()
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", t.addr, err)
	}
	e, err := kvcache.Decode(data, identity, key)
	if err != nil {
		t.refuse(ctx, identity, key, err)
		return nil, err
	}
	return e, nil
}

// Tokens implements kvcache.Tier.
func (t *Tier) Tokens(ctx context.Context, identity, key string) ([]int, error) {
	head, err := t.rdb.HGet(ctx, t.keys(identity)+"e:"+key, "h").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, kvcache.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", t.addr, err)
	}
	toks, err := kvcache.DecodeTokens(head, identity, key)
	if err != nil {
		t.refuse(ctx, identity, key, err)
		return nil, err
	}
	return toks, nil
}

// refuse removes an entry that failed its checks.
func (t *Tier) refuse(ctx context.Context, identity, key string, why error) {
	t.log.Warn("kv shared state refused; the conversation is evaluated again", zap.String("key", key), zap.Error(why))
	p := t.keys(identity)
	if err := t.drop.Run(ctx, t.rdb, []string{p + "e:" + key, p + "lru", p + "bytes", p + "owners"}, key, p+"u:").Err(); err != nil {
		t.log.Warn("kv shared state not removed", zap.String("key", key), zap.Error(err))
	}
}

// Usage implements kvcache.Tier: as the last write of this process saw it.
func (t *Tier) Usage(identity string) (int64, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := t.usage[identity]
	return u[0], int(u[1])
}

// isOOM reports whether Redis refused a write for want of memory
// (maxmemory with a noeviction policy).
func isOOM(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "OOM")
}
