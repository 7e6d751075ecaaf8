package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/testbin"
)

// postAs posts body to path with key and decodes the reply's usage.
func postAs(t *testing.T, addr, key, path string, body map[string]any) (prompt, cached int) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
		t.Fatalf("POST %s: %d %s", path, res.StatusCode, raw)
	}
	return out.Usage.PromptTokens, out.Usage.PromptTokensDetails.CachedTokens
}

// metricAs is metric with key.
func metricAs(t *testing.T, addr, key, sample string) float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The attack: user bob guesses user alice's PIN one digit at
// a time from the cached-token count of raw completions. Alice's
// conversation sits in a slot (keyed, so bob's requests never take it
// over); before each guess bob fills the other slot with an unrelated
// prompt, so that his guess starts from nothing and the engine copies the
// longest prefix any slot holds. With a cache shared across users the right
// digit reported one more cached token, and all 6 digits came out in 60
// guesses. With caches per user every guess reports the same count and
// nothing comes out.
func TestCacheScopeDigitProbe(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin, "--user", "alice:key-alice", "--user", "bob:key-bob", "--store", "memory")
	const pin = "481927"
	opening := "User: The code of the blue door is "
	postAs(t, s.addr, "key-alice", "/v1/chat/completions", map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": "The code of the blue door is " + pin + ". Keep it safe."}},
		"max_tokens": 1,
	})

	probes, recovered := 0, ""
	for pos := range len(pin) {
		counts := make([]int, 10)
		for d := range 10 {
			// The filler takes bob's slot (the LRU one he may have), so the
			// guess below starts from an empty cache.
			postAs(t, s.addr, "key-bob", "/v1/completions", map[string]any{
				"prompt": fmt.Sprintf("Once upon a time there was a cat number %d.", probes), "max_tokens": 1,
			})
			// One token after the guess: a prompt that the cache holds in
			// full is reported one token short (one is always evaluated).
			_, counts[d] = postAs(t, s.addr, "key-bob", "/v1/completions", map[string]any{
				"prompt": opening + recovered + strconv.Itoa(d) + "#", "max_tokens": 1,
			})
			probes++
		}
		best, unique := 0, true
		for d := 1; d < 10; d++ {
			switch {
			case counts[d] > counts[best]:
				best, unique = d, true
			case counts[d] == counts[best]:
				unique = false
			}
		}
		t.Logf("digit %d: cached tokens per guess 0-9 %v", pos+1, counts)
		if !unique {
			break
		}
		recovered += strconv.Itoa(best)
	}
	right := 0
	for right < len(recovered) && recovered[right] == pin[right] {
		right++
	}
	t.Logf("bob recovered %d of %d digits of alice's code (%q) in %d guesses", right, len(pin), recovered, probes)
	if right > 0 || recovered != "" {
		t.Fatalf("bob recovered %q of alice's code %q from the cached-token counts", recovered, pin)
	}
}

// The second channel: a stateless conversation's state, saved
// under a key made of its opening, was restored for another user who sent
// the same opening. Every key is now within its user's scope: bob's request
// reports no cached token and restores nothing, while alice's own resend
// still finds her state (kept in RAM when her slot went to carol). A
// stateless conversation's state never reaches the disk: once a session's
// turn has been written there, it is the only file.
func TestCacheScopeStatelessStateNotShared(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin, "--user", "alice:key-alice", "--user", "bob:key-bob", "--user", "carol:key-carol", "--store", "bolt", "--data-dir", t.TempDir())
	msgs := []map[string]string{{"role": "system", "content": "You tell short stories about a girl called Lily and her dog."},
		{"role": "user", "content": "Tell me about the day Lily found a red ball in the park near the river."}}
	chat := func(key string) (int, int) {
		return postAs(t, s.addr, key, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 4})
	}
	chat("key-alice")
	// Carol's two conversations take both slots: alice's leaves hers.
	for i := range 2 {
		postAs(t, s.addr, "key-carol", "/v1/chat/completions", map[string]any{
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("Story %d: a frog jumps over a log by the pond.", i)}}, "max_tokens": 4})
	}
	prompt, cached := chat("key-bob")
	t.Logf("bob sent alice's conversation: %d prompt tokens, %d cached", prompt, cached)
	if cached != 0 {
		t.Fatalf("bob's copy of alice's conversation reported %d of %d prompt tokens cached", cached, prompt)
	}
	if r := metricAs(t, s.addr, "key-alice", "parley_kv_restores_total"); r != 0 {
		t.Fatalf("parley_kv_restores_total %v, want 0", r)
	}
	// Bob's took a slot of carol's: alice's state is still kept, for her.
	if _, cached := chat("key-alice"); cached < prompt-1 || metricAs(t, s.addr, "key-alice", "parley_kv_restores_total") != 1 {
		t.Fatalf("alice's resend: %d of %d prompt tokens cached, want her saved state restored", cached, prompt)
	}
	postAs(t, s.addr, "key-alice", "/v1/responses", map[string]any{"input": "A stored conversation.", "max_output_tokens": 4})
	deadline := time.Now().Add(20 * time.Second)
	for metricAs(t, s.addr, "key-alice", "parley_kv_disk_writes_total") < 1 || metricAs(t, s.addr, "key-alice", "parley_kv_disk_pending") != 0 ||
		metricAs(t, s.addr, "key-alice", "parley_kv_unsaved_slots") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the session's state was not written")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := metricAs(t, s.addr, "key-alice", "parley_kv_disk_entries"); n != 1 {
		t.Fatalf("%v KV files, want the session's alone", n)
	}
}

// postFrom is postAs from a given loopback address (a client of its own),
// without a key; it returns the status and the usage's cached tokens.
func postFrom(t *testing.T, local, addr, path string, body map[string]any) (int, int) {
	t.Helper()
	b, _ := json.Marshal(body)
	client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext}}
	res, err := client.Post("http://"+addr+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	raw, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(raw, &out)
	return res.StatusCode, out.Usage.PromptTokensDetails.CachedTokens
}

// prompt_cache_key and cache_salt narrow a user's scope: the same value
// shares a prompt's cache, another value (or none) does not, and an
// over-long one is refused. With --cache-scope client two addresses of the
// one anonymous user share nothing; one address shares with itself.
func TestCacheScopeNarrowing(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin, "--cache-scope", "client", "--store", "memory")
	prompt := "Once upon a time there was a little girl called Lily who had a red ball."
	req := func(extra map[string]any) map[string]any {
		body := map[string]any{"prompt": prompt, "max_tokens": 1}
		for k, v := range extra {
			body[k] = v
		}
		return body
	}
	for _, step := range []struct {
		local  string
		extra  map[string]any
		cached bool
	}{
		{"127.0.0.1", nil, false},
		{"127.0.0.1", nil, true},
		{"127.0.0.2", nil, false}, // another client
		{"127.0.0.1", map[string]any{"prompt_cache_key": "x"}, false},
		{"127.0.0.1", map[string]any{"prompt_cache_key": "x"}, true},
		{"127.0.0.1", map[string]any{"prompt_cache_key": "y"}, false},
		{"127.0.0.1", map[string]any{"cache_salt": "x"}, false},
		{"127.0.0.2", map[string]any{"prompt_cache_key": "x"}, false}, // the key does not widen to another client
	} {
		code, cached := postFrom(t, step.local, s.addr, "/v1/completions", req(step.extra))
		if code != http.StatusOK || (cached > 0) != step.cached {
			t.Fatalf("%s %v: status %d, %d tokens cached; want cached %v", step.local, step.extra, code, cached, step.cached)
		}
	}
	if code, _ := postFrom(t, "127.0.0.1", s.addr, "/v1/completions", req(map[string]any{"prompt_cache_key": strings.Repeat("k", 2000)})); code != http.StatusBadRequest {
		t.Fatalf("an over-long prompt_cache_key: %d, want 400", code)
	}
}

// With --cache-scope client a chat socket's turns run in its client's
// scope: a client that resumes another client's session (of the one
// anonymous user) reads its history, not its KV cache, and then reuses its
// own.
func TestCacheScopeClientSocket(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin, "--cache-scope", "client", "--store", "memory")
	dialFrom := func(local, query string) *websocket.Conn {
		t.Helper()
		d := websocket.Dialer{NetDialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext}
		ws, _, err := d.Dial("ws://"+s.addr+"/ws?format=json"+query, nil)
		if err != nil {
			t.Fatalf("dial from %s: %v", local, err)
		}
		t.Cleanup(func() { ws.Close() })
		return ws
	}
	params := map[string]any{"max_tokens": 4}
	a := dialFrom("127.0.0.1", "")
	id := read(t, a).SessionID()
	turn(t, a, "Lily found a red ball.", params)
	if m := turn(t, a, "What did she do next?", params); m.Usage.CachedPromptTokens == 0 {
		t.Fatalf("the client's second turn reused none of its first: %+v", m.Usage)
	}
	a.Close()
	b := dialFrom("127.0.0.2", "&session="+id)
	if m := read(t, b); !m.Resumed {
		t.Fatalf("session %s not resumed from another address: %+v", id, m)
	}
	if m := turn(t, b, "Who came to play?", params); m.Usage.CachedPromptTokens != 0 {
		t.Fatalf("another client's turn reused %d cached tokens of the first client's", m.Usage.CachedPromptTokens)
	}
	if m := turn(t, b, "Was she happy?", params); m.Usage.CachedPromptTokens == 0 {
		t.Fatalf("the other client's second turn reused none of its own first: %+v", m.Usage)
	}
}

// --cache-scope takes user or client; --kv-cache-min-free defaults to the
// store's budget and a margin with bbolt.
func TestCacheFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--model", "m.gguf", "--cache-scope", "everyone"}, func(string) string { return "" }, &bytes.Buffer{}); err == nil ||
		!strings.Contains(err.Error(), "--cache-scope") {
		t.Fatalf("--cache-scope everyone: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{[]string{"--store", "bolt"}, kvMinFreeMargin + 1<<30},
		{[]string{"--store", "bolt", "--max-store-bytes", "1048576"}, kvMinFreeMargin + 1<<20},
		{[]string{"--store", "redis://127.0.0.1:1/0"}, kvMinFreeMargin},
		{[]string{"--store", "bolt", "--kv-cache-min-free", "1GiB"}, 1 << 30},
	} {
		c, err := parseFlags(append([]string{"--model", "m.gguf"}, tc.args...), func(string) string { return "" }, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if got := kvCacheConfig(c).MinFreeBytes; got != tc.want {
			t.Errorf("%v: min free %d, want %d", tc.args, got, tc.want)
		}
	}
}
