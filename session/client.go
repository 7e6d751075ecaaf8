package session

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/parley-chat/parley"
)

// A client is whoever creates sessions, named by an opaque key the wire
// derives (an address, grouped per /64 for IPv6, or a user once users
// exist; never a secret such as an API key). The key arrives as the
// request's parley.Caller (its Client), and the Service stamps it on
// every session the request creates (Session.Owner), so the store can
// bound what one client holds and the Service what one client creates per
// minute.

// Defaults of the per-client limits (cmd/parley's flags).
const (
	DefaultCreatesPerMinute = 30 // sessions one client may create per minute (burst as large)
	DefaultMaxUnused        = 16 // WebSocket sessions one client may hold that never ran a turn
)

// maxRateClients bounds the clients whose creation rate is remembered: past
// it, clients whose bucket has refilled are forgotten (a full bucket is what
// a new client gets anyway), so memory stays bounded whatever the number of
// addresses.
const maxRateClients = 1 << 16

// createLimiter is a token bucket per client: perMinute tokens, refilled
// continuously, one per session created. Safe for concurrent use.
type createLimiter struct {
	perMinute float64 // <= 0: no limit
	now       func() time.Time

	mu      sync.Mutex
	clients map[string]*bucket // guarded by mu
}

type bucket struct {
	tokens float64
	last   time.Time
}

// allow takes one token of client's bucket, or returns an ERateLimited
// error that says when the next one is due.
func (l *createLimiter) allow(client string) error {
	if l.perMinute <= 0 || client == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.clients == nil {
		l.clients = make(map[string]*bucket)
	}
	b, ok := l.clients[client]
	if !ok {
		if len(l.clients) >= maxRateClients {
			l.forgetFull(now)
		}
		b = &bucket{tokens: l.perMinute, last: now}
		l.clients[client] = b
	}
	l.refill(b, now)
	if b.tokens < 1 {
		wait := time.Duration(math.Ceil((1 - b.tokens) / l.perMinute * float64(time.Minute)))
		return &parley.Error{Code: parley.ERateLimited, RetryAfter: wait,
			Message: "too many new sessions from your address: at most " + strconv.Itoa(int(l.perMinute)) + " per minute"}
	}
	b.tokens--
	return nil
}

func (l *createLimiter) refill(b *bucket, now time.Time) {
	if now.After(b.last) {
		b.tokens = min(l.perMinute, b.tokens+l.perMinute*now.Sub(b.last).Minutes())
		b.last = now
	}
}

// forgetFull drops the clients whose buckets have refilled (under mu).
func (l *createLimiter) forgetFull(now time.Time) {
	for k, b := range l.clients {
		if l.refill(b, now); b.tokens >= l.perMinute {
			delete(l.clients, k)
		}
	}
}

// unusedSet remembers, per client, the WebSocket sessions Open stored that
// have not run a turn since, oldest first. Past maxPer for one client, its
// oldest is handed back to be deleted: connections that never talk hold at
// most maxPer sessions per client, and push out only their own client's.
// Safe for concurrent use.
type unusedSet struct {
	maxPer int

	mu    sync.Mutex
	byKey map[string][]string // client -> ids, oldest first; guarded by mu
	total int                 // ids in byKey; guarded by mu
}

// maxUnusedTracked bounds the ids unusedSet remembers in all; past it the
// set forgets (does not delete) whole clients' lists. The store's
// per-client cap still bounds what they hold.
const maxUnusedTracked = 1 << 16

// add records id for client and returns the client's oldest ids pushed out
// past maxPer.
func (u *unusedSet) add(client, id string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.byKey == nil {
		u.byKey = make(map[string][]string)
	}
	for k, ids := range u.byKey {
		if u.total < maxUnusedTracked {
			break
		}
		u.total -= len(ids)
		delete(u.byKey, k)
	}
	ids := append(u.byKey[client], id)
	u.total++
	var out []string
	if n := len(ids) - max(u.maxPer, 1); n > 0 {
		out = append(out, ids[:n]...)
		ids = append([]string(nil), ids[n:]...)
		u.total -= n
	}
	u.byKey[client] = ids
	return out
}

// used forgets id: a turn ran on it.
func (u *unusedSet) used(client, id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	ids := u.byKey[client]
	for i, o := range ids {
		if o == id {
			ids = append(ids[:i:i], ids[i+1:]...)
			u.total--
			break
		}
	}
	if len(ids) == 0 {
		delete(u.byKey, client)
	} else {
		u.byKey[client] = ids
	}
}
