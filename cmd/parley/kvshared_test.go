package main

// The shared KV tier (--kv-cache-shared) in the real binary: two replicas
// share the session store and the tier, and a conversation that moves
// between them continues byte for byte as it would have on one, evaluating
// only its new tokens; a state of another engine, KV layout or user is
// never used; the tier full or down costs a warm start, never a reply.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/internal/testbin"
)

// sharedSlack is how many prompt tokens a turn that moved to another
// replica may evaluate beyond its new ones.
const sharedSlack = 16

// sharedArgs are the flags of every replica of these tests.
func sharedArgs(store, shared string) []string {
	return []string{"--store", store, "--kv-cache-shared", shared, "--max-tokens", "24", "--ctx", "1024"}
}

var sharedPrompts = []string{"Lily found a red ball.", "What did she do next?", "Who came to play?", "What happened at the end?", "Was she happy?"}

// sharedRun is one turn of a session moving between replicas.
type sharedRun struct {
	t       *testing.T
	id      string
	ws      *websocket.Conn
	at      *server
	carried int // prompt + completion tokens of the last turn
	// unsettled: turnAt returns once the reply has ended, without
	// waiting for its state to settle in the tier.
	unsettled bool
}

// turnAt sends prompt on srv (resuming the session there if it was
// elsewhere), waits until its state is in the tier (unless unsettled), and returns the reply
// and how many prompt tokens it evaluated beyond its new ones.
func (r *sharedRun) turnAt(srv *server, prompt string) (reply string, excess int) {
	t := r.t
	t.Helper()
	if r.ws == nil {
		r.ws = srv.dial(t, "")
		r.id = read(t, r.ws).SessionID()
	} else if srv != r.at {
		r.ws.Close()
		r.ws = dialAt(t, srv.addr, "&session="+r.id)
		if m := read(t, r.ws); !m.Resumed {
			t.Fatalf("session %s not resumed on %s: %+v", r.id, srv.addr, m)
		}
	}
	r.at = srv
	m := turn(t, r.ws, prompt, nil)
	if m.Type != "done" || m.FinishReason == "error" {
		t.Fatalf("reply to %q on %s: %+v", prompt, srv.addr, m)
	}
	evaluated := m.Usage.PromptTokens - m.Usage.CachedPromptTokens
	excess = evaluated - (m.Usage.PromptTokens - r.carried)
	r.carried = m.Usage.PromptTokens + m.Usage.CompletionTokens
	if !r.unsettled {
		waitSettled(t, srv.addr, "")
	}
	return m.Content, excess
}

// testSharedMove runs a session over a and b (a, a, b, a, b) and the same
// prompts on ref alone: every reply must be the same, and every turn after
// the first evaluate at most its new tokens + sharedSlack. It returns the
// session, last served by b.
func testSharedMove(t *testing.T, a, b, ref *server) *sharedRun {
	moved := &sharedRun{t: t}
	alone := &sharedRun{t: t}
	route := []*server{a, a, b, a, b}
	restoresB := metric(t, b.addr, "parley_kv_restores_total")
	for j, p := range sharedPrompts {
		got, excess := moved.turnAt(route[j], p)
		want, _ := alone.turnAt(ref, p)
		if got != want {
			t.Fatalf("turn %d on %s: %q; on one replica: %q", j+1, route[j].addr, got, want)
		}
		if j > 0 && excess > sharedSlack {
			t.Fatalf("turn %d on %s evaluated %d tokens beyond its new ones (at most %d)", j+1, route[j].addr, excess, sharedSlack)
		}
		t.Logf("turn %d on %s: %d tokens beyond the new ones; %q", j+1, route[j].addr, excess, got)
	}
	if n := metric(t, b.addr, "parley_kv_restores_total") - restoresB; n < 2 {
		t.Fatalf("replica b restored %v states, want 2 (its two turns)", n)
	}
	return moved
}

// coldAt resumes r's session on srv, which must restore nothing: its turn
// is evaluated whole, and answered.
func (r *sharedRun) coldAt(srv *server, prompt string) {
	t := r.t
	t.Helper()
	restores := metric(t, srv.addr, "parley_kv_restores_total")
	_, excess := r.turnAt(srv, prompt)
	if excess <= sharedSlack || metric(t, srv.addr, "parley_kv_restores_total") != restores {
		t.Fatalf("a turn on %s used a saved state it must not (%d tokens evaluated beyond the new ones)", srv.addr, excess)
	}
}

func TestKVSharedRedis(t *testing.T) {
	bin := testbin.Parley(t)
	rds := redistest.Start(t)
	args := sharedArgs(rds.URL(0), rds.URL(1))
	a, b := start(t, bin, args...), start(t, bin, args...)
	ref := start(t, bin, sharedArgs(rds.URL(2), rds.URL(3))...)
	moved := testSharedMove(t, a, b, ref)

	// A stateless client (the OpenAI API, resending the conversation) moves
	// too: its next turn on b evaluates only what is new.
	msgs := []map[string]string{{"role": "user", "content": "Tom had a big dog."}}
	reply, prompt, _ := chatAt(t, a.addr, "", msgs)
	waitSettled(t, a.addr, "")
	msgs = append(msgs, map[string]string{"role": "assistant", "content": reply}, map[string]string{"role": "user", "content": "What was its name?"})
	_, prompt2, cached := chatAt(t, b.addr, "", msgs)
	if evaluated := prompt2 - cached; cached < prompt-1 || evaluated > prompt2-prompt+sharedSlack {
		t.Fatalf("a stateless conversation's second turn on b: %d of %d prompt tokens cached (the first turn had %d)", cached, prompt2, prompt)
	}

	// Another engine, or another KV layout (a state is valid only for as
	// many KV streams): the session's next turn there restores nothing.
	// The replicas run the engine PARLEY_ENGINE names (the current one
	// unless it says embedded): the other one is the foreign engine.
	switch {
	case os.Getenv("PARLEY_ENGINE") != "embedded":
		moved.coldAt(start(t, bin, append(args, "--engine", "embedded")...), "Did it rain?")
	case os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") != "1":
		moved.coldAt(start(t, bin, append(args, "--engine", "current")...), "Did it rain?")
	default:
		t.Log("the current engine is skipped (PARLEY_SKIP_CURRENT_ENGINE=1): no other engine to check")
	}
	moved.coldAt(start(t, bin, append(args, "--parallel", "3")...), "Did the sun come out?")
}

// The same over a shared folder, and between users: a stateless
// conversation of alice's, resent by bob word for word, restores nothing on
// the replica bob reaches; resent by alice there, it does.
func TestKVSharedDir(t *testing.T) {
	bin := testbin.Parley(t)
	dir := t.TempDir()
	users := []string{"--user", "alice:key-alice", "--user", "bob:key-bob"}
	args := append(sharedArgs("memory", dir), users...)
	a, b := start(t, bin, args...), start(t, bin, args...)

	msgs := []map[string]string{{"role": "user", "content": "Mia went to the park."}}
	reply, prompt, _ := chatAt(t, a.addr, "key-alice", msgs)
	waitSettled(t, a.addr, "key-alice")
	msgs = append(msgs, map[string]string{"role": "assistant", "content": reply}, map[string]string{"role": "user", "content": "Who did she see?"})
	if _, _, cached := chatAt(t, b.addr, "key-bob", msgs); cached != 0 || metricAs(t, b.addr, "key-bob", "parley_kv_restores_total") != 0 {
		t.Fatalf("bob's request on b used alice's state: %d tokens cached", cached)
	}
	_, prompt2, cached := chatAt(t, b.addr, "key-alice", msgs)
	if cached < prompt-1 || metricAs(t, b.addr, "key-alice", "parley_kv_restores_total") != 1 {
		t.Fatalf("alice's second turn on b: %d of %d prompt tokens cached (the first turn had %d)", cached, prompt2, prompt)
	}
}

// A replica killed (kill -9) as soon as its replies have ended loses none
// of their states: a reply's end waits for its state to be in the tier
// (--kv-cache-shared-wait), so the next turn of a session and of a resent
// conversation, on the other replica, restores it and evaluates only what
// is new.
func TestKVSharedKilledAfterReply(t *testing.T) {
	bin := testbin.Parley(t)
	rds := redistest.Start(t)
	args := sharedArgs(rds.URL(0), rds.URL(1))
	a, b := start(t, bin, args...), start(t, bin, args...)

	msgs := []map[string]string{{"role": "user", "content": "Tom had a big dog."}}
	reply, prompt, _ := chatAt(t, a.addr, "", msgs)
	r := &sharedRun{t: t, unsettled: true}
	r.turnAt(a, sharedPrompts[0])
	a.Kill()

	restores := metric(t, b.addr, "parley_kv_restores_total")
	if _, excess := r.turnAt(b, sharedPrompts[1]); excess > sharedSlack {
		t.Fatalf("the session's turn after the kill evaluated %d tokens beyond its new ones (at most %d)", excess, sharedSlack)
	}
	msgs = append(msgs, map[string]string{"role": "assistant", "content": reply}, map[string]string{"role": "user", "content": "What was its name?"})
	if _, prompt2, cached := chatAt(t, b.addr, "", msgs); cached < prompt-1 {
		t.Fatalf("a resent conversation's turn after the kill: %d of %d prompt tokens cached (its first turn had %d)", cached, prompt2, prompt)
	}
	if n := metric(t, b.addr, "parley_kv_restores_total") - restores; n != 2 {
		t.Fatalf("b restored %v states, want 2", n)
	}
	if n := metric(t, b.addr, "parley_kv_shared_waits_total"); n != 2 {
		t.Fatalf("b held %v replies' ends for the tier, want 2", n)
	}
}

// The tier full, then down: every turn is answered, cold where it moved,
// and each replica says why in its log.
func TestKVSharedDegrades(t *testing.T) {
	bin := testbin.Parley(t)
	rds, kv := redistest.Start(t), redistest.Start(t)
	full := append(sharedArgs(rds.URL(0), kv.URL(0)), "--kv-cache-shared-bytes", "1KiB")
	a, b := start(t, bin, full...), start(t, bin, full...)
	r := &sharedRun{t: t}
	r.turnAt(a, sharedPrompts[0])
	r.coldAt(b, sharedPrompts[1])
	if !strings.Contains(a.log(), "kv shared tier full") {
		t.Fatalf("no log line of the tier full on a:\n%s", a.log())
	}
	a.Kill()
	b.Kill()

	args := sharedArgs(rds.URL(1), kv.URL(1))
	a, b = start(t, bin, args...), start(t, bin, args...)
	r = &sharedRun{t: t}
	r.turnAt(a, sharedPrompts[0])
	r.turnAt(b, sharedPrompts[1]) // warm: the tier is up
	kv.Kill()
	r.turnAt(b, sharedPrompts[2])
	r.coldAt(a, sharedPrompts[3])
	for _, s := range []*server{a, b} {
		if !strings.Contains(s.log(), "kv shared tier down") {
			t.Fatalf("no log line of the tier down on %s:\n%s", s.addr, s.log())
		}
	}
}

// waitSettled waits until the replica at addr has saved every slot's state
// and no state waits for the tier (written, or refused).
func waitSettled(t *testing.T, addr, key string) {
	t.Helper()
	deadline := time.Now().Add(hangWait) // catches a hang only
	for metricAs(t, addr, key, "parley_kv_unsaved_slots") != 0 || metricAs(t, addr, key, "parley_kv_disk_pending") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the KV states did not settle")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chatAt posts a chat completion (greedy) as key ("" for none) and returns
// the reply, its prompt tokens and how many of them were cached.
func chatAt(t *testing.T, addr, key string, msgs []map[string]string) (reply string, prompt, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"messages": msgs, "max_tokens": 24, "temperature": 0})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Choices) != 1 {
		t.Fatalf("chat at %s: %d %s", addr, res.StatusCode, raw)
	}
	return out.Choices[0].Message.Content, out.Usage.PromptTokens, out.Usage.PromptTokensDetails.CachedTokens
}
