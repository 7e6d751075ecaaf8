package llm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
)

func seqOf(client, name string) *sequence {
	return &sequence{ctx: context.Background(), client: client, req: parley.GenerateRequest{Key: name, Client: client}}
}

func popNames(q *fairQueue, n int) string {
	var out []string
	for range n {
		s := q.pop()
		if s == nil {
			out = append(out, "-")
			continue
		}
		out = append(out, s.req.Key)
	}
	return strings.Join(out, " ")
}

// TestFairQueueRoundRobin: one client's many requests do not stand before
// another's one; each client's own stay in order.
func TestFairQueueRoundRobin(t *testing.T) {
	q := newFairQueue(100, 100, 0)
	for _, n := range []string{"a1", "a2", "a3", "a4"} {
		if err := q.push(seqOf("a", n)); err != nil {
			t.Fatal(err)
		}
	}
	q.push(seqOf("b", "b1"))
	q.push(seqOf("c", "c1"))
	q.push(seqOf("b", "b2"))
	if got, want := popNames(q, 8), "a1 b1 c1 a2 b2 a3 a4 -"; got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
}

// TestFairQueueCaps: a client's waiting requests are capped (busy, with
// Retry-After) while others still get in; a client holding its slots is
// passed over while another waits or was present within clientLinger, and
// takes them all when alone. The clock is the test's: no time passes.
func TestFairQueueCaps(t *testing.T) {
	q := newFairQueue(10, 3, 2)
	now := time.Unix(1e9, 0)
	q.now = func() time.Time { return now }
	for i := range 3 {
		if err := q.push(seqOf("heavy", "h")); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	err := q.push(seqOf("heavy", "h"))
	if parley.ErrorCode(err) != parley.EBusy || parley.RetryAfter(err) <= 0 {
		t.Fatalf("heavy's 4th: %v, want busy with Retry-After", err)
	}
	if err := q.push(seqOf("light", "l")); err != nil {
		t.Fatalf("light refused while heavy is at its cap: %v", err)
	}
	// heavy gets two slots, then is passed over while light waits.
	if got := popNames(q, 3); got != "h l h" {
		t.Fatalf("order %q", got)
	}
	// While light generates, heavy keeps to its two slots: the third stays
	// free for light's next request.
	if got := popNames(q, 1); got != "-" {
		t.Fatalf("heavy took a third slot while light generates: %q", got)
	}
	q.done(seqOf("light", ""))
	// light's reply ended: its next request comes a moment later, and
	// finds the slot free, unless light has been gone for clientLinger.
	now = now.Add(clientLinger - time.Millisecond)
	if got := popNames(q, 1); got != "-" {
		t.Fatalf("heavy took a third slot the moment light's reply ended: %q", got)
	}
	now = now.Add(time.Millisecond)
	if got := popNames(q, 1); got != "h" {
		t.Fatalf("heavy alone could not take a third slot: %q", got)
	}
	if _, ok := q.clients["light"]; ok {
		t.Fatal("light is still remembered past clientLinger")
	}
	q.push(seqOf("light", "l"))
	q.push(seqOf("heavy", "h"))
	if got := popNames(q, 1); got != "l" {
		t.Fatalf("heavy over its slots was served before light: %q", got)
	}
	// Ending heavy's slots brings it under the cap again.
	for range 3 {
		q.done(seqOf("heavy", ""))
	}
	q.done(seqOf("light", ""))
	if got := popNames(q, 2); got != "h -" {
		t.Fatalf("after heavy's slots ended: %q", got)
	}
	if n := len(q.drain()); n != 0 || q.n != 0 {
		t.Fatalf("drain left %d, n %d", n, q.n)
	}
	// The whole queue's cap holds for everyone.
	q2 := newFairQueue(2, 2, 0)
	q2.push(seqOf("a", "a"))
	q2.push(seqOf("b", "b"))
	if err := q2.push(seqOf("c", "c")); parley.ErrorCode(err) != parley.EBusy {
		t.Fatalf("over the whole queue: %v", err)
	}
}

// TestFairQueueLends: a client at its share takes a slot kept free for a
// client between its requests when lend says the slot can be taken back,
// never while another client waits, nor when lend says no.
func TestFairQueueLends(t *testing.T) {
	q := newFairQueue(10, 10, 1)
	now := time.Unix(1e9, 0)
	q.now = func() time.Time { return now }
	lend := true
	var asked []string
	q.lend = func(seq *sequence) bool { asked = append(asked, seq.req.Key); return lend }
	q.push(seqOf("light", "l"))
	q.push(seqOf("heavy", "h1"))
	q.push(seqOf("heavy", "h2"))
	if got := popNames(q, 2); got != "l h1" {
		t.Fatalf("order %q", got)
	}
	q.done(seqOf("light", "")) // light is between requests: present, waiting for nothing
	lend = false
	if got := popNames(q, 1); got != "-" {
		t.Fatalf("heavy took a slot past its share that lend refused: %q", got)
	}
	q.push(seqOf("light", "l2"))
	lend = true
	asked = nil
	if got := popNames(q, 1); got != "l2" {
		t.Fatalf("light waited while heavy took the slot: %q", got)
	}
	if got := popNames(q, 1); got != "h2" {
		t.Fatalf("heavy was not lent the slot no one waits for: %q", got)
	}
	if len(asked) != 1 || asked[0] != "h2" {
		t.Fatalf("lend asked about %v, want [h2]", asked)
	}
}

// TestFairQueuePreemption: a waiting client with no slot is paired with the
// client holding the most (at least two); the one that steps out goes back
// first in its client's queue.
func TestFairQueuePreemption(t *testing.T) {
	q := newFairQueue(10, 10, -1)
	for range 3 {
		q.push(seqOf("heavy", "h"))
	}
	q.push(seqOf("heavy", "h-next"))
	if got := popNames(q, 3); got != "h h h" {
		t.Fatalf("order %q", got)
	}
	if _, _, ok := q.preemption(); ok {
		t.Fatal("a preemption with no newcomer waiting")
	}
	q.push(seqOf("light", "l"))
	newcomer, victim, ok := q.preemption()
	if !ok || newcomer != "light" || victim != "heavy" {
		t.Fatalf("preemption: %q from %q, %v", newcomer, victim, ok)
	}
	q.requeue(seqOf("heavy", "h-back"))
	if s := q.popFrom("light"); s == nil || s.req.Key != "l" {
		t.Fatalf("popFrom light: %v", s)
	}
	if got := popNames(q, 3); got != "h-back h-next -" {
		t.Fatalf("after the preemption: %q", got)
	}
	// A client holding one slot is not a victim.
	q2 := newFairQueue(10, 10, -1)
	q2.push(seqOf("a", "a"))
	q2.push(seqOf("b", "b"))
	popNames(q2, 2)
	q2.push(seqOf("c", "c"))
	if _, _, ok := q2.preemption(); ok {
		t.Fatal("a preemption from clients holding one slot each")
	}
}
