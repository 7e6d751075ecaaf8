package kvcache_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/parley-chat/parley/llm/kvcache"
	"github.com/parley-chat/parley/llm/kvcache/kvcachetest"
)

// waitShared waits until the writer has tried n states on the shared tier.
func waitShared(t *testing.T, c *kvcache.Cache, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // catches a hang only
	for {
		st := c.Stats()
		if st.SharedWrites+st.SharedWriteErrors+st.SharedFull >= n && st.DiskPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("shared writes %+v, want %d", st, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sharedCache(t *testing.T, tier kvcache.Tier, identity string, log *zap.Logger) *kvcache.Cache {
	t.Helper()
	return open(t, kvcache.Config{RAMBytes: 1 << 20, Identity: identity, Shared: tier, Logger: log})
}

// Two replicas' caches on one shared tier: what one saves, the other
// restores; a replica whose own copy is older takes the tier's newer one;
// a cache of another identity finds nothing.
func TestCacheSharedTier(t *testing.T) {
	ta, tb := openDirTiers(t, 1<<20)
	a, b := sharedCache(t, ta, "model-a", nil), sharedCache(t, tb, "model-a", nil)
	e := kvcachetest.Entry("scope:s1", 10, 1)
	a.Put(e)
	waitShared(t, a, 1)
	prompt := append(slices.Clone(e.Tokens), 500, 501)
	got, err := b.GetFor(e.Key, prompt, 8)
	if err != nil || !slices.Equal(got.Tokens, e.Tokens) || string(got.State) != string(e.State) {
		t.Fatalf("b: %v, %v", got, err)
	}
	if toks := b.Tokens(e.Key); !slices.Equal(toks, e.Tokens) {
		t.Fatalf("b's tokens: %v", toks)
	}
	if st := b.Stats(); st.SharedLoads != 1 || st.SharedReadErrors != 0 {
		t.Fatalf("b's stats: %+v", st)
	}

	// b serves the next turns: a's copy is older, the tier's holds more of
	// the prompt.
	longer := kvcachetest.Entry("scope:s1", 30, 1)
	b.Put(longer)
	waitShared(t, b, 1)
	prompt = append(slices.Clone(longer.Tokens), 600)
	if got, err := a.GetFor(e.Key, prompt, 8); err != nil || len(got.Tokens) != 30 {
		t.Fatalf("a after b's turn: %v, %v; want the tier's 30 tokens", got, err)
	}
	if toks := a.Tokens(e.Key); len(toks) != 30 {
		t.Fatalf("a's tokens after b's turn: %d, want 30", len(toks))
	}
	// A prompt that left the tier's branch after a's copy: a's own.
	a.Put(e)
	waitShared(t, a, 2)
	b.Put(longer)
	waitShared(t, b, 2)
	edited := append(slices.Clone(e.Tokens), 700, 701, 702)
	if got, err := a.GetFor(e.Key, edited, 8); err != nil || len(got.Tokens) != 10 {
		t.Fatalf("a with an edited prompt: %v, %v; want its own 10 tokens", got, err)
	}

	c := sharedCache(t, ta, "model-b", nil)
	if got, err := c.GetFor(e.Key, prompt, 8); !errors.Is(err, kvcache.ErrNotFound) {
		t.Fatalf("another model's cache: %v, %v", got, err)
	}
	if toks := c.Tokens(e.Key); toks != nil {
		t.Fatalf("another model's cache has tokens %v", toks)
	}
}

// brokenTier fails every call as a store that is down does.
type brokenTier struct{ calls int }

var errDown = errors.New("dial tcp: connection refused")

func (b *brokenTier) Put(context.Context, string, *kvcache.Entry) (int64, error) {
	b.calls++
	return 0, errDown
}
func (b *brokenTier) Get(context.Context, string, string) (*kvcache.Entry, error) {
	b.calls++
	return nil, errDown
}
func (b *brokenTier) Tokens(context.Context, string, string) ([]int, error) {
	b.calls++
	return nil, errDown
}
func (b *brokenTier) Usage(string) (int64, int) { return 0, 0 }
func (b *brokenTier) String() string            { return "broken" }

// A tier that is down or full: reads find nothing (the turn is evaluated),
// writes keep the state in RAM, each with one log line, not one per call.
func TestCacheSharedTierDownOrFull(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	bt := &brokenTier{}
	c := sharedCache(t, bt, "model-a", zap.New(core))
	e := kvcachetest.Entry("scope:s1", 10, 1)
	for range 3 {
		if got, err := c.GetFor("scope:other", e.Tokens, 8); got != nil || err == nil || errors.Is(err, kvcache.ErrNotFound) {
			t.Fatalf("get with the tier down: %v, %v", got, err)
		}
	}
	c.Put(e)
	waitShared(t, c, 1)
	if got, err := c.GetFor(e.Key, e.Tokens, 8); err != nil || got != e {
		t.Fatalf("the state kept in RAM: %v, %v", got, err)
	}
	// Within the retry interval only the first read reaches the tier; a
	// busy machine may let the interval pass, so that is not asserted.
	if st := c.Stats(); st.SharedReadErrors < 1 || st.SharedWriteErrors != 1 || bt.calls < 1 {
		t.Fatalf("stats %+v, %d calls: want a failed read and a failed write", st, bt.calls)
	}
	if n := logs.FilterMessageSnippet("kv shared tier down").Len(); n != 1 {
		t.Fatalf("%d log lines of the tier down, want 1: %v", n, logs.All())
	}

	core, logs = observer.New(zap.InfoLevel)
	small, err := kvcache.OpenDirTier(t.TempDir(), 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	c = sharedCache(t, small, "model-a", zap.New(core))
	c.Put(e)
	c.Put(kvcachetest.Entry("scope:s2", 10, 2))
	waitShared(t, c, 2)
	if st := c.Stats(); st.SharedFull != 2 || st.SharedWrites != 0 {
		t.Fatalf("stats %+v: want 2 states refused as full", st)
	}
	if got, err := c.GetFor(e.Key, e.Tokens, 8); err != nil || got != e {
		t.Fatalf("the state kept in RAM: %v, %v", got, err)
	}
	if n := logs.FilterMessageSnippet("kv shared tier full").Len(); n != 1 {
		t.Fatalf("%d log lines of the tier full, want 1: %v", n, logs.All())
	}
}

// PutThen's callback runs once the state is in the shared tier (another
// replica reads it there), and at once for a state that does not go there.
func TestCachePutThenWritten(t *testing.T) {
	ta, tb := openDirTiers(t, 1<<20)
	a, b := sharedCache(t, ta, "model-a", nil), sharedCache(t, tb, "model-a", nil)
	e := kvcachetest.Entry("scope:s1", 10, 1)
	written := make(chan struct{})
	a.PutThen(e, func() { close(written) })
	select {
	case <-written:
	case <-time.After(time.Minute): // catches a hang only
		t.Fatal("the callback never ran")
	}
	if got, err := b.GetFor(e.Key, e.Tokens, 0); err != nil || string(got.State) != string(e.State) {
		t.Fatalf("after the callback, the other replica reads %v, %v", got, err)
	}
	ramOnly := kvcachetest.Entry("scope:s2", 10, 2)
	ramOnly.RAMOnly = true
	called := false
	a.PutThen(ramOnly, func() { called = true })
	if !called {
		t.Fatal("a RAM-only state's callback did not run at once")
	}
}

// countingTier counts the calls that reach a tier.
type countingTier struct {
	kvcache.Tier
	gets, tokens int
}

func (t *countingTier) Get(ctx context.Context, identity, key string) (*kvcache.Entry, error) {
	t.gets++
	return t.Tier.Get(ctx, identity, key)
}

func (t *countingTier) Tokens(ctx context.Context, identity, key string) ([]int, error) {
	t.tokens++
	return t.Tier.Tokens(ctx, identity, key)
}

// A replica that has no copy of a conversation reads the tier once for it:
// the tokens the chat layer asks for bring the state along, and the
// engine's fetch that follows takes it from RAM.
func TestCacheSharedTierOneRead(t *testing.T) {
	ta, tb := openDirTiers(t, 1<<20)
	a := sharedCache(t, ta, "model-a", nil)
	counted := &countingTier{Tier: tb}
	b := sharedCache(t, counted, "model-a", nil)
	e := kvcachetest.Entry("scope:s1", 10, 1)
	a.Put(e)
	waitShared(t, a, 1)
	if toks := b.Tokens(e.Key); !slices.Equal(toks, e.Tokens) {
		t.Fatalf("tokens %v", toks)
	}
	got, err := b.GetFor(e.Key, append(slices.Clone(e.Tokens), 500), 8)
	if err != nil || string(got.State) != string(e.State) {
		t.Fatalf("GetFor: %v, %v", got, err)
	}
	if counted.gets != 1 || counted.tokens != 0 {
		t.Fatalf("the tier was read %d times and asked for tokens %d times, want once and never", counted.gets, counted.tokens)
	}
}
