// Package kvcachetest is the conformance suite of kvcache.Tier: every
// implementation (the shared directory, Redis) runs the same tests, as
// testing/fstest does for file systems.
package kvcachetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/kvcache"
)

// Open returns two handles on one fresh store (what two replicas see), each
// keeping an identity's entries within budget bytes.
type Open func(t *testing.T, budget int64) (a, b kvcache.Tier)

// Entry is a state of n tokens under key, its bytes marked by seed.
func Entry(key string, n int, seed byte) *kvcache.Entry {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = i*7 + int(seed)
	}
	return &kvcache.Entry{Key: key, Tokens: toks, State: bytes.Repeat([]byte{seed}, n*64)}
}

// Size is the bytes an implementation stores for e (its encoding).
func Size(e *kvcache.Entry) int64 { return int64(len(kvcache.Encode("id-a", e))) }

// TestTier runs the suite.
func TestTier(t *testing.T, open Open) {
	ctx := context.Background()
	const idA, idB = "id-a", "id-b"

	t.Run("a state written by one replica is read by another", func(t *testing.T) {
		a, b := open(t, 1<<20)
		e := Entry("scope1:s1", 40, 1)
		n, err := a.Put(ctx, idA, e)
		if err != nil || n != Size(e) {
			t.Fatalf("put: %d, %v; want %d", n, err, Size(e))
		}
		got, err := b.Get(ctx, idA, e.Key)
		if err != nil || !slices.Equal(got.Tokens, e.Tokens) || !bytes.Equal(got.State, e.State) || got.Key != e.Key {
			t.Fatalf("get: %v, %v", got, err)
		}
		toks, err := b.Tokens(ctx, idA, e.Key)
		if err != nil || !slices.Equal(toks, e.Tokens) {
			t.Fatalf("tokens: %v, %v", toks, err)
		}
		// A newer state of the key replaces it.
		e2 := Entry("scope1:s1", 60, 2)
		if _, err := b.Put(ctx, idA, e2); err != nil {
			t.Fatal(err)
		}
		if got, err := a.Get(ctx, idA, e.Key); err != nil || !slices.Equal(got.Tokens, e2.Tokens) || !bytes.Equal(got.State, e2.State) {
			t.Fatalf("get after replace: %v, %v", got, err)
		}
		if bytes, entries := b.Usage(idA); bytes != Size(e2) || entries != 1 {
			t.Fatalf("usage after replace: %d bytes in %d entries, want %d in 1", bytes, entries, Size(e2))
		}
	})

	t.Run("no state of another identity or key", func(t *testing.T) {
		a, b := open(t, 1<<20)
		e := Entry("scope1:s1", 40, 3)
		if _, err := a.Put(ctx, idA, e); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ id, key string }{
			{idB, e.Key},           // another model, llama.cpp build or KV layout
			{idA, "scope2:s1"},     // the same session id in another user's scope
			{idA, "s1"},            // the anonymous user's
			{idA, "scope1:s1\x00"}, // a key that only starts like it
		} {
			if _, err := b.Get(ctx, c.id, c.key); !errors.Is(err, kvcache.ErrNotFound) {
				t.Errorf("get %q of %q: %v, want ErrNotFound", c.key, c.id, err)
			}
			if _, err := b.Tokens(ctx, c.id, c.key); !errors.Is(err, kvcache.ErrNotFound) {
				t.Errorf("tokens %q of %q: %v, want ErrNotFound", c.key, c.id, err)
			}
		}
	})

	t.Run("the budget evicts the least recently used", func(t *testing.T) {
		one := Size(Entry("k0", 100, 0))
		a, b := open(t, 3*one+one/2) // room for three
		for i := range 3 {
			if _, err := a.Put(ctx, idA, Entry(fmt.Sprintf("k%d", i), 100, byte(i))); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.Get(ctx, idA, "k0"); err != nil { // k0 used: k1 is now the oldest
			t.Fatal(err)
		}
		if _, err := b.Put(ctx, idA, Entry("k3", 100, 3)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Get(ctx, idA, "k1"); !errors.Is(err, kvcache.ErrNotFound) {
			t.Fatalf("the least recently used entry: %v, want ErrNotFound", err)
		}
		for _, k := range []string{"k0", "k2", "k3"} {
			if _, err := a.Get(ctx, idA, k); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
		}
		if bytes, entries := b.Usage(idA); bytes > 3*one+one/2 || entries != 3 {
			t.Fatalf("usage: %d bytes in %d entries, want at most %d in 3", bytes, entries, 3*one+one/2)
		}
		// Another identity's entries have their own budget.
		if _, err := a.Put(ctx, idB, Entry("k0", 100, 9)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Get(ctx, idA, "k0"); err != nil {
			t.Fatalf("another identity's write evicted: %v", err)
		}
	})

	t.Run("a user's writes evict another user's states only while that one holds more", func(t *testing.T) {
		alice, bob := parley.UserCacheScope("alice"), parley.UserCacheScope("bob")
		one := Size(Entry(alice+":a0", 40, 1))
		a, b := open(t, 4*one+one/2)
		put := func(key string, seed byte) {
			t.Helper()
			if _, err := a.Put(ctx, idA, Entry(key, 40, seed)); err != nil {
				t.Fatal(err)
			}
		}
		held := func(want map[string]bool) {
			t.Helper()
			for k, kept := range want {
				_, err := b.Tokens(ctx, idA, k)
				if kept && err != nil || !kept && !errors.Is(err, kvcache.ErrNotFound) {
					t.Fatalf("%s: %v, want kept %t", k, err, kept)
				}
			}
		}
		put(alice+":a0", 1)
		put(alice+":a1", 2)
		// bob writes five: each write past the budget takes bob's own oldest
		// (he holds the most), never alice's two, older as they are. A
		// narrowed scope of alice's (a prompt_cache_key's) is still hers.
		for i := range 5 {
			put(fmt.Sprintf("%s:b%d", bob, i), byte(10+i))
		}
		held(map[string]bool{alice + ":a0": true, alice + ":a1": true, bob + ":b0": false, bob + ":b1": false,
			bob + ":b2": false, bob + ":b3": true, bob + ":b4": true})
		narrowed := parley.ScopedKey(parley.NarrowCacheScope(alice, "prompt_cache_key=x"), "a2")
		put(narrowed, 3)
		// Now alice holds the most: her own oldest goes.
		held(map[string]bool{alice + ":a0": false, alice + ":a1": true, narrowed: true, bob + ":b3": true, bob + ":b4": true})
	})

	t.Run("a state larger than the budget is refused as full", func(t *testing.T) {
		a, b := open(t, 1000)
		if _, err := a.Put(ctx, idA, Entry("big", 100, 1)); !errors.Is(err, kvcache.ErrTierFull) {
			t.Fatalf("put: %v, want ErrTierFull", err)
		}
		if _, err := b.Get(ctx, idA, "big"); !errors.Is(err, kvcache.ErrNotFound) {
			t.Fatalf("get: %v, want ErrNotFound", err)
		}
	})
}
