package kvredis_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/llm/kvcache"
	"github.com/parley-chat/parley/llm/kvcache/kvcachetest"
	"github.com/parley-chat/parley/llm/kvcache/kvredis"
)

// BenchmarkRestorePath times what a replica does to restore a conversation
// another one served, step by step: the lookup of its tokens, the read of
// the whole state (the fetch, with its checks), and the checks alone
// (Decode: the header and the checksum), for a state of a 1,500-token
// conversation of stories260K (about 1 MiB) and of a 1B model's 500 tokens
// (16 MiB). get-lua is the read as a script returning the state (how the
// tier read before: Lua copies the value in and out), for comparison in the
// same run.
func BenchmarkRestorePath(b *testing.B) {
	rds := redistest.Start(b)
	ctx := context.Background()
	for _, size := range []struct {
		name          string
		tokens, bytes int
	}{{"1MiB", 1500, 1 << 20}, {"16MiB", 500, 16 << 20}} {
		tr, err := kvredis.Open(ctx, rds.URL(0), fmt.Sprintf("bench%s:kv:", size.name), 1<<30, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Close()
		e := kvcachetest.Entry("scope:s1", size.tokens, 3)
		e.State = make([]byte, size.bytes)
		if _, err := tr.Put(ctx, "id", e); err != nil {
			b.Fatal(err)
		}
		data := kvcache.Encode("id", e)
		raw := redis.NewClient(&redis.Options{Addr: rds.Addr})
		defer raw.Close()
		luaKey := fmt.Sprintf("bench%s:lua", size.name)
		if err := raw.HSet(ctx, luaKey, "b", data).Err(); err != nil {
			b.Fatal(err)
		}
		lua := redis.NewScript(`local v = redis.call('HGET', KEYS[1], 'b'); redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1]); return v`)
		b.Run(size.name+"/get-lua", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				v, err := lua.Run(ctx, raw, []string{luaKey, luaKey + ":lru", luaKey + ":clock"}, "k").Text()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := kvcache.Decode([]byte(v), "id", e.Key); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/tokens", func(b *testing.B) {
			for b.Loop() {
				if _, err := tr.Tokens(ctx, "id", e.Key); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/get", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := tr.Get(ctx, "id", e.Key); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/decode", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := kvcache.Decode(data, "id", e.Key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
