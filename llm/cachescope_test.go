package llm_test

import (
	"context"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// Requests of different cache scopes (users) share nothing: not a slot's
// cache, not a copied prefix, not a saved state, even under the same key
// and with the same tokens; requests of one scope still share all three.
func TestCacheScopesShareNothing(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2, Threads: 1, KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20}})
	toks, err := e.Tokenize("Once upon a time there was a little girl called Lily. She had a red ball and a small dog.")
	if err != nil {
		t.Fatal(err)
	}
	more := append(append([]int(nil), toks...), toks[1:9]...)
	alice, bob, carol := parley.UserCacheScope("alice"), parley.UserCacheScope("bob"), parley.UserCacheScope("carol")
	run := func(scope, key string, toks []int) parley.Usage {
		t.Helper()
		ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: key, Scope: scope, Tokens: toks, Params: greedy(4)})
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, ch)
		if r.final.Err != nil {
			t.Fatal(r.final.Err)
		}
		return r.final.Usage
	}

	run(alice, "k", toks)
	if u := run(bob, "k", toks); u.CachedPromptTokens != 0 {
		t.Fatalf("bob, alice's key and prompt: %d prompt tokens cached, want 0", u.CachedPromptTokens)
	}
	// Bob's second conversation takes alice's slot (her state is saved)
	// and copies his own first one's prefix from the other slot.
	if u := run(bob, "k2", more); u.CachedPromptTokens < len(toks) {
		t.Fatalf("bob's second conversation: %d prompt tokens cached, want his own first prompt's %d (copied)", u.CachedPromptTokens, len(toks))
	}
	if st := e.Stats(); st.KVCache.Saves != 1 || st.PrefixCopies != 1 {
		t.Fatalf("saves %d, prefix copies %d; want alice's state saved, bob's prefix copied", st.KVCache.Saves, st.PrefixCopies)
	}
	if u := run(carol, "k", toks); u.CachedPromptTokens != 0 || e.Stats().KVCache.Restores != 0 {
		t.Fatalf("carol, alice's key and prompt: %d prompt tokens cached, %d restores; want none", u.CachedPromptTokens, e.Stats().KVCache.Restores)
	}
	if u := run(alice, "k", toks); u.CachedPromptTokens != len(toks)-1 || e.Stats().KVCache.Restores != 1 {
		t.Fatalf("alice's own key: %d prompt tokens cached, %d restores; want her saved state restored", u.CachedPromptTokens, e.Stats().KVCache.Restores)
	}
	if got := e.SavedTokens(parley.ScopedKey(bob, "k")); got == nil {
		t.Fatal("bob's first conversation was not saved under his own key")
	}
	if got := e.SavedTokens("k"); got != nil {
		t.Fatal("a state was saved under a key outside every user's scope")
	}
}
