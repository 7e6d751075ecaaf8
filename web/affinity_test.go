package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

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

// TestAffinityHeaderFamilies: the Responses API names a stored response's
// session (the same along its previous_response_id chain), derives a key
// for a response not stored, and echoes a key the client sent (header or
// prompt_cache_key); completions, TGI and JSON lines keep a raw prompt's
// derived key as it grows, and echo a sent key.
func TestAffinityHeaderFamilies(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) {
		c.Users = []web.UserKey{{User: "alice", Key: "alice-key"}, {User: "bob", Key: "bob-key"}}
	})
	call := func(path string, body map[string]any, key string, hdr ...string) (string, map[string]any) {
		t.Helper()
		res := post(t, s.base+path, body, append([]string{"Authorization", "Bearer " + key}, hdr...)...)
		var out map[string]any
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", path, res.StatusCode)
		}
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return res.Header.Get(parley.AffinityHeader), out
	}

	// A stored chain: its session's id, turn after turn.
	k1, r1 := call("/v1/responses", map[string]any{"input": "Tell me about a cat.", "max_output_tokens": 4}, "alice-key")
	k2, _ := call("/v1/responses", map[string]any{"input": "And then?", "max_output_tokens": 4, "previous_response_id": r1["id"]}, "alice-key")
	_, sess, err := s.sessions.GetResponse(context.Background(), parley.Caller{User: "alice"}, r1["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if sid := sess.ID; k1 != sid || k2 != sid {
		t.Fatalf("a chain's keys are %q then %q, its session is %q", k1, k2, sid)
	}
	// Not stored: derived from the input, the same as it is resent grown.
	input := []map[string]any{{"role": "user", "content": "Tell me about a dog."}}
	n1, _ := call("/v1/responses", map[string]any{"input": input, "store": false, "max_output_tokens": 4}, "alice-key")
	grown := append(input, map[string]any{"role": "assistant", "content": "A dog."}, map[string]any{"role": "user", "content": "More."})
	n2, _ := call("/v1/responses", map[string]any{"input": grown, "store": false, "max_output_tokens": 4}, "alice-key")
	if n1 == "" || n1 != n2 || n1 == k1 {
		t.Fatalf("an unstored conversation's keys are %q then %q (the stored one's %q)", n1, n2, k1)
	}
	if nb, _ := call("/v1/responses", map[string]any{"input": input, "store": false, "max_output_tokens": 4}, "bob-key"); nb == n1 {
		t.Fatalf("bob's unstored conversation has alice's key %q", nb)
	}
	if got, _ := call("/v1/responses", map[string]any{"input": input, "store": false, "max_output_tokens": 4, "prompt_cache_key": "pk-1"}, "alice-key"); got != "pk-1" {
		t.Fatalf("an unstored response with prompt_cache_key pk-1 has key %q", got)
	}
	if got, _ := call("/v1/responses", map[string]any{"input": "Hi.", "max_output_tokens": 4}, "alice-key", parley.AffinityHeader, "mine-3"); got != "mine-3" {
		t.Fatalf("a response whose client sent mine-3 has key %q", got)
	}

	// The Responses WebSocket names the key its client sent.
	ws, res, err := websocket.DefaultDialer.Dial(s.url+"/v1/responses", http.Header{"Authorization": {"Bearer alice-key"}, parley.AffinityHeader: {"mine-5"}})
	if err != nil {
		t.Fatal(err)
	}
	ws.Close()
	if got := res.Header.Get(parley.AffinityHeader); got != "mine-5" {
		t.Fatalf("the Responses WebSocket's upgrade with mine-5 sent has key %q", got)
	}

	// Raw prompts: the derived key holds as the prompt grows past its opening.
	long := strings.Repeat("Once upon a time there was a cat. ", 10)
	c1, _ := call("/v1/completions", map[string]any{"prompt": long, "max_tokens": 4}, "alice-key")
	c2, _ := call("/v1/completions", map[string]any{"prompt": long + "It ran away.", "max_tokens": 4}, "alice-key")
	if c1 == "" || c1 != c2 {
		t.Fatalf("a growing prompt's keys are %q then %q", c1, c2)
	}
	if cb, _ := call("/v1/completions", map[string]any{"prompt": long, "max_tokens": 4}, "bob-key"); cb == c1 {
		t.Fatalf("bob's prompt has alice's key %q", cb)
	}
	if got, _ := call("/v1/completions", map[string]any{"prompt": long, "max_tokens": 4, "prompt_cache_key": "pk-2"}, "alice-key"); got != "pk-2" {
		t.Fatalf("a completion with prompt_cache_key pk-2 has key %q", got)
	}
	if got, _ := call("/v1/chat/completions", map[string]any{"messages": userMsgs("Hi."), "max_tokens": 4, "prompt_cache_key": "pk-3"}, "alice-key"); got != "pk-3" {
		t.Fatalf("a chat with prompt_cache_key pk-3 has key %q", got)
	}
	tgi := map[string]any{"inputs": long, "parameters": map[string]any{"max_new_tokens": 4}}
	if got, _ := call("/generate", tgi, "alice-key"); got != c1 {
		t.Fatalf("TGI's key for the completion's prompt is %q, the completion's %q", got, c1)
	}
	if got, _ := call("/generate?format=jsonlines", tgi, "alice-key", parley.AffinityHeader, "mine-4"); got != "mine-4" {
		t.Fatalf("JSON lines with mine-4 sent has key %q", got)
	}
}
