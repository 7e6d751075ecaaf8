package kvredis_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/llm/kvcache"
	"github.com/parley-chat/parley/llm/kvcache/kvcachetest"
	"github.com/parley-chat/parley/llm/kvcache/kvredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prefixes gives every store of a test keys of their own in one server.
var prefixes atomic.Int64

func openTier(t *testing.T, url, prefix string, budget int64) *kvredis.Tier {
	t.Helper()
	tr, err := kvredis.Open(context.Background(), url, prefix, budget, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestTier(t *testing.T) {
	rds := redistest.Start(t)
	kvcachetest.TestTier(t, func(t *testing.T, budget int64) (kvcache.Tier, kvcache.Tier) {
		p := fmt.Sprintf("test%d:kv:", prefixes.Add(1))
		return openTier(t, rds.URL(0), p, budget), openTier(t, rds.URL(0), p, budget)
	})
}

// What is stored under one key and moved under another (another user's),
// or cut short, is refused and removed; Redis out of memory is the tier
// full; Redis down is an error that is neither (the cache falls back).
func TestTierRefusesAndFails(t *testing.T) {
	ctx := context.Background()
	rds := redistest.Start(t)
	tr := openTier(t, rds.URL(1), "parley:kv:", 1<<20)
	raw := redis.NewClient(&redis.Options{Addr: rds.Addr, DB: 1})
	t.Cleanup(func() { raw.Close() })

	a := kvcachetest.Entry("userA:s1", 50, 1)
	if _, err := tr.Put(ctx, "id", a); err != nil {
		t.Fatal(err)
	}
	keys, err := raw.Keys(ctx, "parley:kv:*:e:userA:s1").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	forged := keys[0][:len(keys[0])-len("userA:s1")] + "userB:s1"
	if err := raw.Copy(ctx, keys[0], forged, 1, false).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, "id", "userB:s1"); !errors.Is(err, kvcache.ErrForeign) {
		t.Fatalf("another user's state: %v, want ErrForeign", err)
	}
	if _, err := tr.Tokens(ctx, "id", "userB:s1"); !errors.Is(err, kvcache.ErrNotFound) {
		t.Fatalf("the refused state stayed: %v", err)
	}
	b, _ := raw.HGet(ctx, keys[0], "b").Bytes()
	if err := raw.HSet(ctx, keys[0], "b", b[:len(b)-3]).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, "id", "userA:s1"); !errors.Is(err, kvcache.ErrCorrupt) {
		t.Fatalf("a truncated state: %v, want ErrCorrupt", err)
	}
	if bytes, _ := raw.Get(ctx, keys[0][:len(keys[0])-len("e:userA:s1")]+"bytes").Int64(); bytes != 0 {
		t.Fatalf("%d bytes still counted after both were removed", bytes)
	}

	// Out of memory (maxmemory with noeviction): full, not down.
	if err := raw.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, "id", a); !errors.Is(err, kvcache.ErrTierFull) {
		t.Fatalf("put with redis out of memory: %v, want ErrTierFull", err)
	}
	raw.ConfigSet(ctx, "maxmemory", "0")

	rds.Kill()
	if _, err := tr.Put(ctx, "id", a); err == nil || errors.Is(err, kvcache.ErrTierFull) {
		t.Fatalf("put with redis down: %v", err)
	}
	if _, err := tr.Get(ctx, "id", "userA:s1"); err == nil || errors.Is(err, kvcache.ErrNotFound) {
		t.Fatalf("get with redis down: %v", err)
	}
}
