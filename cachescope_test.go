package parley_test

import (
	"testing"

	"github.com/parley-chat/parley"
)

// Scopes: one per user, the anonymous user's empty (its keys unchanged),
// a client's within its user's, a narrowing within its parent; ScopedKey
// is idempotent and never maps two scopes' keys to one.
func TestCacheScopes(t *testing.T) {
	anon := parley.ReplyRequest{}.CacheScope()
	alice, bob := parley.ReplyRequest{User: "alice"}.CacheScope(), parley.ReplyRequest{User: "bob"}.CacheScope()
	if anon != "" || parley.ScopedKey(anon, "s1") != "s1" {
		t.Fatalf("anonymous: scope %q, key %q", anon, parley.ScopedKey(anon, "s1"))
	}
	if alice == bob || alice == "" || alice != parley.UserCacheScope("alice") {
		t.Fatal("alice and bob share a scope")
	}
	ka := parley.ScopedKey(alice, "s1")
	if ka == parley.ScopedKey(bob, "s1") || ka == "s1" || parley.ScopedKey(alice, ka) != ka || parley.ScopedKey(alice, "") != "" {
		t.Fatalf("keys: alice %q, bob %q", ka, parley.ScopedKey(bob, "s1"))
	}
	if parley.ScopedKey(bob, ka) == ka {
		t.Fatal("bob's scope kept alice's key as it was")
	}
	narrow := parley.NarrowCacheScope(alice, "prompt_cache_key=x")
	for _, other := range []string{alice, bob, parley.NarrowCacheScope(bob, "prompt_cache_key=x"), parley.NarrowCacheScope(alice, "prompt_cache_key=y")} {
		if narrow == other {
			t.Fatal("a narrowed scope equals another")
		}
	}
	if parley.NarrowCacheScope(alice, "") != alice {
		t.Fatal("an empty key narrowed the scope")
	}
	if parley.ClientCacheScope("alice", "10.0.0.1") == parley.ClientCacheScope("alice", "10.0.0.2") ||
		parley.ClientCacheScope("alice", "10.0.0.1") == parley.ClientCacheScope("bob", "10.0.0.1") {
		t.Fatal("client scopes collide")
	}
	if s := (parley.ReplyRequest{User: "alice", Scope: parley.ClientCacheScope("alice", "10.0.0.1")}).CacheScope(); s != parley.ClientCacheScope("alice", "10.0.0.1") {
		t.Fatal("ReplyRequest.Scope not used")
	}
	// Every key of alice's, whatever its client or narrowing, has her as
	// its owner; bob's and the anonymous user's do not.
	owner := parley.ScopeOwner(ka)
	if owner == "" || owner != parley.UserCacheScope("alice") {
		t.Fatalf("alice's key %q has owner %q", ka, owner)
	}
	for _, k := range []string{parley.ScopedKey(narrow, "s2"), parley.ClientCacheScope("alice", "10.0.0.1") + ":s3",
		parley.ScopedKey(parley.NarrowCacheScope(narrow, "cache_salt=z"), "s4")} {
		if parley.ScopeOwner(k) != owner {
			t.Fatalf("alice's key %q has owner %q, want %q", k, parley.ScopeOwner(k), owner)
		}
	}
	for _, k := range []string{parley.ScopedKey(bob, "s1"), "s1", "openai:0123", parley.ScopedKey(parley.NarrowCacheScope(anon, "prompt_cache_key=x"), "s1")} {
		if o := parley.ScopeOwner(k); o == owner || (o != "" && k != parley.ScopedKey(bob, "s1")) {
			t.Fatalf("key %q has owner %q", k, o)
		}
	}
}
