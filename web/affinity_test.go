package web_test

import (
	"net/http"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web"
)

// TestAffinityHeader: a resent conversation's replies name the same
// affinity key turn after turn (derived from its user and opening when the
// client sends none), a key the client sends comes back as it is, and
// another user's conversation with the same opening gets another key.
func TestAffinityHeader(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) {
		c.Users = []web.UserKey{{User: "alice", Key: "alice-key"}, {User: "bob", Key: "bob-key"}}
	})
	ask := func(key string, msgs []map[string]any, hdr ...string) string {
		t.Helper()
		res := post(t, s.base+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 4},
			append([]string{"Authorization", "Bearer " + key}, hdr...)...)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("status %d", res.StatusCode)
		}
		return res.Header.Get(parley.AffinityHeader)
	}
	first := userMsgs("Tell me about a cat.")
	k1 := ask("alice-key", first)
	grown := append(userMsgs("Tell me about a cat."), map[string]any{"role": "assistant", "content": "A cat."},
		map[string]any{"role": "user", "content": "And then?"})
	k2 := ask("alice-key", grown)
	if k1 == "" || k1 != k2 {
		t.Fatalf("a resent conversation's key changed between turns: %q then %q", k1, k2)
	}
	if kb := ask("bob-key", first); kb == "" || kb == k1 {
		t.Fatalf("bob's conversation with alice's opening has key %q, alice's is %q", kb, k1)
	}
	if ko := ask("alice-key", userMsgs("Something else entirely.")); ko == k1 {
		t.Fatalf("another opening has the same key %q", ko)
	}
	if got := ask("alice-key", first, parley.AffinityHeader, "my-conversation-7"); got != "my-conversation-7" {
		t.Fatalf("the client's key came back as %q", got)
	}
}
