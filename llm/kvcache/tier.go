package kvcache

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// This file is the shared tier: in place of the files of one process
// (Config.Dir), a store every replica reaches (Config.Shared) keeps the
// states, so the replica that serves a conversation's next turn restores it
// whichever replica served the last one. It is a tier below RAM like the
// directory: written by the writer after a turn (never by the decode loop),
// read on the request's goroutine. A tier that is full or down costs the
// turns that move their warm start, never an error: reads and writes fail
// over to evaluating the conversation again, with a log line when the tier
// goes down or fills up and one when it is back.

// Tier is a store of saved states that several processes share: a directory
// every replica mounts (DirTier) or Redis (package kvredis). Entries are
// kept by identity (Config.Identity) and key (the session's, which carries
// its user's cache scope); an implementation stores Encode's bytes and
// returns only what Decode accepts for the identity and key asked for, and
// it keeps each identity's entries within a byte budget, fairly between
// users: past the budget, the least recently used entry of the user
// (parley.ScopeOwner of its key) who holds the most bytes goes first, so a
// user's states are evicted by another's writes only while they hold more
// than that user's. Safe for concurrent use.
type Tier interface {
	// Put stores e for its key, replacing the key's entry, and returns the
	// bytes it stored. ErrTierFull: no room (e is larger than the budget,
	// or the store refused it for want of memory or disk).
	Put(ctx context.Context, identity string, e *Entry) (int64, error)
	// Get returns key's entry and counts it used. ErrNotFound when there
	// is none; ErrCorrupt or ErrForeign when what is stored fails its
	// checks (it is removed).
	Get(ctx context.Context, identity, key string) (*Entry, error)
	// Tokens returns the tokens of key's entry without reading its state,
	// with Get's errors.
	Tokens(ctx context.Context, identity, key string) ([]int, error)
	// Usage returns the bytes and entries held for identity as last seen
	// by this process (no I/O): for metrics.
	Usage(identity string) (bytes int64, entries int)
	// String names the tier for logs (no credentials).
	String() string
}

// ErrTierFull is a state a Tier has no room for.
var ErrTierFull = errors.New("kvcache: the shared tier is full")

// errTierDown is a call not made: the tier failed within sharedRetry.
var errTierDown = errors.New("kvcache: the shared tier is down")

// Timeouts of the shared tier's calls. A state of a long conversation is
// tens of MiB: sharedIOTimeout bounds its read or write, sharedPeekTimeout
// a lookup of its tokens. sharedRetry is how long the tier is left alone
// after a failure, so that a store that is down (or unreachable) costs the
// requests one failed call per interval, not one timeout each.
const (
	sharedIOTimeout   = 30 * time.Second
	sharedPeekTimeout = 2 * time.Second
	sharedRetry       = time.Second
	// tierFresh is how long an entry read from the tier is taken as the
	// tier's current one without asking again: the engine's fetch follows
	// the chat layer's Tokens within it. Another replica writing the key
	// meanwhile (the conversation served on two at once) costs at most a
	// warm start, never a wrong reply: the engine restores only the prefix
	// the prompt shares.
	tierFresh = 2 * time.Second
)

// Health of the shared tier, for the log lines of its transitions.
const (
	tierUp int32 = iota
	tierDown
	tierFull
)

// Shared reports whether the cache's lower tier is a shared store.
func (c *Cache) Shared() bool { return c.cfg.Shared != nil }

// writeShared writes e to the shared tier. Called by the writer.
func (c *Cache) writeShared(e *Entry) {
	if c.tierResting() {
		c.sharedWriteErrors.Add(1)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedIOTimeout)
	n, err := c.cfg.Shared.Put(ctx, c.cfg.Identity, e)
	cancel()
	switch {
	case err == nil:
		c.sharedWrites.Add(1)
		c.sharedWriteBytes.Add(n)
		c.tierOK()
	case errors.Is(err, ErrTierFull):
		c.sharedFull.Add(1)
		if c.health.Swap(tierFull) != tierFull {
			c.log.Warn("kv shared tier full: states that do not fit stay in this replica's RAM; a turn that moves to another replica is evaluated again",
				zap.Stringer("tier", c.cfg.Shared), zap.String("key", e.Key), zap.Int64("bytes", e.size()), zap.Error(err))
		}
	default:
		c.sharedWriteErrors.Add(1)
		c.tierFailed(err)
	}
}

// tierResting reports whether the tier failed within sharedRetry.
func (c *Cache) tierResting() bool { return time.Now().UnixNano() < c.downUntil.Load() }

// tierFailed records a failed call: logged when the tier was up, then no
// call for sharedRetry.
func (c *Cache) tierFailed(err error) {
	c.downUntil.Store(time.Now().Add(sharedRetry).UnixNano())
	if c.health.Swap(tierDown) != tierDown {
		c.log.Warn("kv shared tier down: turns that move to another replica are evaluated again until it is back",
			zap.Stringer("tier", c.cfg.Shared), zap.Error(err))
	}
}

// tierOK records a call that worked: logged when the tier was down or full.
func (c *Cache) tierOK() {
	if c.health.Swap(tierUp) != tierUp {
		c.log.Info("kv shared tier back", zap.Stringer("tier", c.cfg.Shared))
	}
}

// sharedErr sorts the error of a read: an entry's own fault (none, corrupt,
// foreign) says nothing of the tier; any other is the tier failing.
func (c *Cache) sharedErr(err error) error {
	switch {
	case err == nil:
		c.tierOK()
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrCorrupt), errors.Is(err, ErrForeign):
		c.tierOK()
		if !errors.Is(err, ErrNotFound) {
			c.refused(err)
		}
	case errors.Is(err, errTierDown):
	default:
		c.sharedReadErrors.Add(1)
		c.tierFailed(err)
	}
	return err
}

// refused counts an entry that failed its checks.
func (c *Cache) refused(err error) {
	if errors.Is(err, ErrForeign) {
		c.foreign.Add(1)
	} else {
		c.corrupt.Add(1)
	}
}

// sharedTokens returns the tokens of key's entry in the shared tier.
func (c *Cache) sharedTokens(key string) ([]int, error) {
	if c.tierResting() {
		return nil, errTierDown
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedPeekTimeout)
	defer cancel()
	toks, err := c.cfg.Shared.Tokens(ctx, c.cfg.Identity, key)
	return toks, c.sharedErr(err)
}

// sharedGet reads key's entry from the shared tier and keeps it in RAM.
func (c *Cache) sharedGet(key string) (*Entry, error) {
	if c.tierResting() {
		return nil, errTierDown
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), sharedIOTimeout)
	e, err := c.cfg.Shared.Get(ctx, c.cfg.Identity, key)
	cancel()
	if c.sharedErr(err) != nil {
		return nil, err
	}
	c.sharedLoads.Add(1)
	c.sharedLoadNanos.Add(int64(time.Since(t0)))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ramRemove(key)
	if e.size() <= c.cfg.RAMBytes {
		c.ram[key] = c.ramLRU.PushFront(e)
		c.ramBytes += e.size()
		c.readAt[key] = time.Now()
		c.ramEvict()
	}
	return e, nil
}

// freshFromTier reports whether key's entry in RAM was read from the tier
// within tierFresh.
func (c *Cache) freshFromTier(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.readAt[key]
	return ok && time.Since(t) < tierFresh
}

// memory returns key's entry in RAM or queued for the lower tier, or nil.
func (c *Cache) memory(key string) *Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pending[key]; ok {
		return e // newer than RAM's, should the RAM copy have been evicted and replaced
	}
	if el, ok := c.ram[key]; ok {
		c.ramLRU.MoveToFront(el)
		return el.Value.(*Entry)
	}
	return nil
}

// GetFor returns the entry of key that holds the longest prefix of prompt:
// this process's (in RAM, or queued for the shared tier), or the shared
// tier's when it holds at least minGain more of prompt (another replica
// served the conversation since: this one's copy is older). Only the
// tokens of the shared entry are read unless it is the one returned. The
// errors are the shared tier's when this process has no entry (ErrNotFound
// when nobody has one); with one, a failing tier returns it. Without a
// shared tier it is Get.
func (c *Cache) GetFor(key string, prompt []int, minGain int) (*Entry, error) {
	if c.cfg.Shared == nil {
		return c.Get(key)
	}
	mem := c.memory(key)
	if mem == nil {
		return c.sharedGet(key)
	}
	if c.freshFromTier(key) {
		return mem, nil
	}
	toks, err := c.sharedTokens(key)
	if err != nil || commonPrefix(toks, prompt) < commonPrefix(mem.Tokens, prompt)+minGain {
		return mem, nil
	}
	if e, err := c.sharedGet(key); err == nil {
		return e, nil
	}
	return mem, nil
}

// commonPrefix is the length of the prefix a and b share.
func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
