package chatsocket

import (
	"sync"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// inbox is one connection's work in arrival order: prompts, control
// messages, and the answers to messages that were not queued (refusals,
// invalid messages). The worker takes them one at a time, so every answer
// reaches the client in the order of the messages it answers: a refusal
// never lands inside a reply that is streaming, and a text client's k-th
// sentinel always ends the answer to its k-th prompt.
//
// Bounded whatever the client sends: at most maxJobs prompts and control
// messages; an answer equal to the item before it is merged into it (a
// count, so a flood of refused prompts costs one item); and at most
// maxItems items in all. The reader pushes, the worker pops; mu guards
// every field but wake.
type inbox struct {
	mu       sync.Mutex
	items    []job
	jobs     int // items that are not answers; <= maxJobs
	maxJobs  int
	maxItems int
	// wake has capacity 1; a push leaves a value in it, so a worker that
	// found the inbox empty and then waits on wake cannot miss an item.
	wake chan struct{}
}

func newInbox(maxJobs int) *inbox {
	return &inbox{
		maxJobs: maxJobs,
		// Room for an answer between every two jobs and at both ends, and
		// as many again for runs of answers that differ (varied invalid
		// messages): beyond that the client is flooding.
		maxItems: 4*maxJobs + 8,
		wake:     make(chan struct{}, 1),
	}
}

// push queues a prompt or control message; false means maxJobs are waiting.
func (q *inbox) push(j job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.jobs >= q.maxJobs || len(q.items) >= q.maxItems {
		return false
	}
	q.items = append(q.items, j)
	q.jobs++
	q.signal()
	return true
}

// pushAnswer queues err as the answer to one message. newRun is false when
// it was merged into an equal answer queued just before it; ok is false
// when the inbox is full, and nothing was queued.
func (q *inbox) pushAnswer(err error) (newRun, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.items); n > 0 {
		if last := &q.items[n-1]; last.kind == jobAnswer && sameAnswer(last.err, err) {
			last.n++
			return false, true
		}
	}
	if len(q.items) >= q.maxItems {
		return false, false
	}
	q.items = append(q.items, job{kind: jobAnswer, err: err, n: 1})
	q.signal()
	return true, true
}

// pop takes the oldest item; false when there is none.
func (q *inbox) pop() (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return job{}, false
	}
	j := q.items[0]
	q.items[0] = job{} // let the prompt's text be collected
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // do not keep a grown backing array for an idle connection
	}
	if j.kind != jobAnswer {
		q.jobs--
	}
	return j, true
}

// len is the number of items waiting.
func (q *inbox) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (q *inbox) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// sameAnswer reports whether two answers would read the same to the client.
func sameAnswer(a, b error) bool {
	return parley.ErrorCode(a) == parley.ErrorCode(b) && parley.ErrorMessage(a) == parley.ErrorMessage(b) && apicore.ErrorField(a) == apicore.ErrorField(b)
}
