package session

// An internal test: the lock table is unexported, and its one property worth
// pinning down (no entry outlives its callers) is not visible from outside.

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestKeyLockForgetsReleasedKeys(t *testing.T) {
	var l keyLock
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		unlock, err := l.lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	if n := l.len(); n != 0 {
		t.Fatalf("%d entries after every key was released", n)
	}

	unlock, err := l.lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// A waiter that gives up leaves no entry behind once the holder releases.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := l.lock(wctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter: err = %v, want the deadline", err)
	}
	if n := l.len(); n != 1 {
		t.Fatalf("%d entries while a is held, want 1", n)
	}
	unlock()
	if n := l.len(); n != 0 {
		t.Fatalf("%d entries after release, want 0", n)
	}
}
