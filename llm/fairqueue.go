package llm

import (
	"sync"
	"time"

	"github.com/parley-chat/parley"
)

// busyRetryAfter is the Retry-After of a refusal for a full queue: about
// one reply's time, after which a slot has likely come free.
const busyRetryAfter = 2 * time.Second

// fairQueue is the wait for a slot, shared fairly between clients
// (GenerateRequest.Client: an address, or a named user). Each client has a FIFO
// of its own and the clients are served round robin, so one client's many
// requests never stand before another's one: a newcomer waits for the next
// free slot, not behind the whole queue. Two caps keep one client from
// taking everything: the sequences it may have waiting (past it Generate
// refuses it with busy, while others still get in), and the slots it may
// hold while another client is generating or waiting: those left over stay
// free for the others' next requests, which then start at once instead of
// waiting for one of its replies to end. Alone, a client may use every slot.
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
	clients   map[string]*clientQueue // guarded by mu; an entry lives while it has sequences waiting or active
	ring      []*clientQueue          // clients with sequences waiting, in turn order; guarded by mu
	next      int                     // index in ring of the client served next
	n         int                     // sequences waiting, in all
	perClient int                     // refusals for a client's cap (cumulative)
}

type clientQueue struct {
	name   string
	seqs   []*sequence // waiting, oldest first
	active int         // slots held (popped and not yet done)
}

// newFairQueue: max sequences waiting in all, maxPer for one client (<= 0
// or over max: max), slotsPer slots for one client while another waits
// (<= 0: no cap).
func newFairQueue(max, maxPer, slotsPer int) *fairQueue {
	if maxPer <= 0 || maxPer > max {
		maxPer = max
	}
	return &fairQueue{signal: make(chan struct{}, 1), max: max, maxPer: maxPer, slotsPer: slotsPer,
		clients: map[string]*clientQueue{}}
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
// that holds its slotsPer slots while another client has a sequence waiting
// or generating. The caller holds a slot for it until done.
func (q *fairQueue) pop() *sequence {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range q.ring {
		k := (q.next + i) % len(q.ring)
		c := q.ring[k]
		if q.slotsPer > 0 && c.active >= q.slotsPer && len(q.clients) > 1 {
			// Another client is generating or waiting: c leaves it the
			// slots past its share, so that the other's next request
			// finds one free instead of waiting for one of c's replies
			// to end.
			continue
		}
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
	return nil
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
		delete(q.clients, name)
	}
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
			delete(q.clients, c.name)
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
