package llm

import (
	"slices"
	"sync"
	"time"

	"github.com/parley-chat/parley"
)

// busyRetryAfter is the Retry-After of a refusal for a full queue: about
// one reply's time, after which a slot has likely come free.
const busyRetryAfter = 2 * time.Second

// clientLinger is how long a client whose requests have all ended still
// counts as present for the cap on slots per client. A client sends its next
// request a moment after its reply (an agent's next step, a script's loop,
// a light user between short questions); were it forgotten at once, a heavy
// client would take every slot in that moment, and the next request would
// wait for one of the heavy client's replies to end (measured with
// tools/fairbench: that wait was nearly all of the light users' p95 time to
// the first token beside a heavy user). One busy refusal's Retry-After:
// a client refused comes back within it too.
const clientLinger = busyRetryAfter

// fairQueue is the wait for a slot, shared fairly between clients
// (GenerateRequest.Client: an address, or a named user). Each client has a FIFO
// of its own and the clients are served round robin, so one client's many
// requests never stand before another's one: a newcomer waits for the next
// free slot, not behind the whole queue. Two caps keep one client from
// taking everything: the sequences it may have waiting (past it Generate
// refuses it with busy, while others still get in), and the slots it may
// hold while another client is generating, waiting or was, within
// clientLinger: those left over stay free for the others' next requests,
// which then start at once instead of waiting for one of its replies to end.
// Alone, a client may use every slot.
//
// Generate pushes from any goroutine; the loop pops, and tells done when a
// sequence it popped ends. Safe for concurrent use.
type fairQueue struct {
	// signal has a value when something was pushed since the loop last
	// looked (1-buffered; a push never blocks).
	signal chan struct{}

	max       int // sequences waiting at most, in all
	maxPer    int // sequences one client may have waiting
	slotsPer  int // slots one client may hold while another waits
	mu        sync.Mutex
	clients   map[string]*clientQueue // guarded by mu; an entry lives while it has sequences waiting or active, and clientLinger after
	ring      []*clientQueue          // clients with sequences waiting, in turn order; guarded by mu
	next      int                     // index in ring of the client served next
	n         int                     // sequences waiting, in all
	perClient int                     // refusals for a client's cap (cumulative)
	now       func() time.Time        // the clock of clientLinger (time.Now; a test's own)
	swept     time.Time               // when idle clients were last forgotten
	// lend, when set, says whether a slot lent to seq past its client's
	// share can be taken back at the cost of a copy (the engine's stepping
	// out with its KV state, preempt.go): then a client at its share may
	// take a free slot that no other client waits for. Called by pop, on
	// the loop, q.mu held.
	lend func(seq *sequence) bool
}

type clientQueue struct {
	name   string
	seqs   []*sequence // waiting, oldest first
	active int         // slots held (popped and not yet done)
	// idleSince is when its last sequence ended with none waiting (zero
	// while it has some): it counts as present until clientLinger after.
	idleSince time.Time
}

// present: c has sequences waiting or generating, or had within clientLinger.
func (c *clientQueue) present(now time.Time) bool {
	return c.active > 0 || len(c.seqs) > 0 || now.Sub(c.idleSince) < clientLinger
}

// newFairQueue: max sequences waiting in all, maxPer for one client (<= 0
// or over max: max), slotsPer slots for one client while another waits
// (<= 0: no cap).
func newFairQueue(max, maxPer, slotsPer int) *fairQueue {
	if maxPer <= 0 || maxPer > max {
		maxPer = max
	}
	return &fairQueue{signal: make(chan struct{}, 1), max: max, maxPer: maxPer, slotsPer: slotsPer,
		clients: map[string]*clientQueue{}, now: time.Now}
}

// push queues seq for its client, or returns an EBusy error (with
// Retry-After) when the queue, or the client's share of it, is full.
func (q *fairQueue) push(seq *sequence) error {
	name := seq.client
	q.mu.Lock()
	c := q.clients[name]
	switch {
	case q.n >= q.max:
		q.mu.Unlock()
		return &parley.Error{Code: parley.EBusy, RetryAfter: busyRetryAfter,
			Message: "the server is busy: every slot is taken and the queue is full; try again shortly"}
	case c != nil && len(c.seqs) >= q.maxPer:
		q.perClient++
		q.mu.Unlock()
		return &parley.Error{Code: parley.EBusy, RetryAfter: busyRetryAfter,
			Message: "you have as many requests waiting for a slot as one client may; try again when one of them ends"}
	}
	if c == nil {
		c = &clientQueue{name: name}
		q.clients[name] = c
	}
	c.idleSince = time.Time{}
	if len(c.seqs) == 0 {
		q.ring = append(q.ring, c)
	}
	c.seqs = append(c.seqs, seq)
	q.n++
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
	return nil
}

// pop returns the next sequence to admit, or nil when none may be: round
// robin from the client after the last one served, passing over a client
// that holds its slotsPer slots while another client is present (has a
// sequence waiting or generating, or had within clientLinger), unless no
// other client waits and lend says a slot lent can be taken back cheaply:
// a slot kept free for a client between its requests is a slot that does
// nothing (measured with tools/fairbench: a heavy client beside light ones
// filled 6.8 of 8 slots a step with the share kept, 8.0 lent), and the
// client coming back takes it at once by stepping one of the borrower's
// sequences out. The caller holds a slot for it until done.
func (q *fairQueue) pop() *sequence {
	q.mu.Lock()
	defer q.mu.Unlock()
	others := -1 // clients present, counted once when a cap needs it
	for i := range q.ring {
		k := (q.next + i) % len(q.ring)
		c := q.ring[k]
		if q.slotsPer > 0 && c.active >= q.slotsPer {
			if others < 0 {
				others = q.presentLocked() - 1 // c is present: it waits
			}
			if others > 0 && (len(q.ring) > 1 || q.lend == nil || !q.lend(c.seqs[0])) {
				// Another client is present: c leaves it the slots past
				// its share, so that the other's next request finds one
				// free instead of waiting for one of c's replies to end.
				continue
			}
		}
		return q.takeLocked(k)
	}
	return nil
}

// takeLocked pops the first sequence of the client at q.ring[k], which
// holds a slot for it from now on, and moves the turn to the client after
// it. q.mu held.
func (q *fairQueue) takeLocked(k int) *sequence {
	c := q.ring[k]
	seq := c.seqs[0]
	c.seqs[0] = nil
	c.seqs = c.seqs[1:]
	c.active++
	q.n--
	if len(c.seqs) == 0 {
		q.ring = append(q.ring[:k], q.ring[k+1:]...)
		q.next = k // the client that followed c moved into k
	} else {
		q.next = k + 1
	}
	if len(q.ring) > 0 {
		q.next %= len(q.ring)
	} else {
		q.next = 0
	}
	return seq
}

// done ends the slot a popped sequence held.
func (q *fairQueue) done(seq *sequence) {
	name := seq.client
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.clients[name]
	if c == nil {
		return
	}
	c.active--
	if c.active <= 0 && len(c.seqs) == 0 {
		c.idleSince = q.now()
		q.sweepLocked(c.idleSince)
	}
}

// presentLocked counts the clients present (forgetting those that no longer
// are). q.mu held.
func (q *fairQueue) presentLocked() int {
	now := q.now()
	n := 0
	for name, c := range q.clients {
		if c.present(now) {
			n++
		} else {
			delete(q.clients, name)
		}
	}
	q.swept = now
	return n
}

// sweepLocked forgets the clients idle for longer than clientLinger, at most
// once per clientLinger, so the map holds no more than the clients seen in
// the last two lingers however many come and go. q.mu held.
func (q *fairQueue) sweepLocked(now time.Time) {
	if now.Sub(q.swept) < clientLinger {
		return
	}
	q.presentLocked()
}

// preemption finds a client that should get a slot by taking one from
// another while every slot generates: newcomer has a sequence waiting and no
// slot (the first such in turn order), victim holds the most slots, at
// least two. ok is false when there is no such pair.
func (q *fairQueue) preemption() (newcomer, victim string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range q.ring {
		if c := q.ring[(q.next+i)%len(q.ring)]; c.active == 0 {
			newcomer = c.name
			break
		}
	}
	if newcomer == "" {
		return "", "", false
	}
	most := 1
	for name, c := range q.clients {
		if c.active > most || (c.active == most && most > 1 && name < victim) {
			victim, most = name, c.active
		}
	}
	return newcomer, victim, victim != ""
}

// popFrom pops the oldest waiting sequence of the client name (nil when it
// has none), as pop would in its turn.
func (q *fairQueue) popFrom(name string) *sequence {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := slices.IndexFunc(q.ring, func(c *clientQueue) bool { return c.name == name })
	if k < 0 {
		return nil
	}
	q.next = k
	return q.takeLocked(k)
}

// requeue puts a popped sequence back at the front of its client's queue,
// whatever the caps, and ends the slot it held: preempted, it goes on first
// when its client's turn comes.
func (q *fairQueue) requeue(seq *sequence) {
	name := seq.client
	q.mu.Lock()
	c := q.clients[name]
	if c == nil {
		c = &clientQueue{name: name}
		q.clients[name] = c
	}
	if len(c.seqs) == 0 {
		q.ring = append(q.ring, c)
	}
	c.seqs = append([]*sequence{seq}, c.seqs...)
	c.idleSince = time.Time{}
	c.active--
	q.n++
	q.mu.Unlock()
}

// drain takes every waiting sequence (at shutdown); they hold no slot.
func (q *fairQueue) drain() []*sequence {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*sequence
	for _, c := range q.ring {
		out = append(out, c.seqs...)
		c.seqs = nil
		if c.active <= 0 {
			c.idleSince = q.now()
		}
	}
	q.ring, q.next, q.n = nil, 0, 0
	return out
}

// refusedPerClient is how many pushes a client's cap refused.
func (q *fairQueue) refusedPerClient() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.perClient
}
