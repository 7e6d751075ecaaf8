package main

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/internal/testbin"
)

// Conversations stay warm across kill -9 in the real binary:
// more conversations than slots, so most states leave their slot for the
// KV cache; the server is killed once the saved-state gauges settle and
// started again on the same data, and each conversation's next turn must
// evaluate only its new tokens (plus warmSlack), restored from its saved
// state through the chat layer's SavedTokens path, whatever text the
// replies tokenize to. On bbolt and on Redis.
//
// The CI run is bounded (warmConfig); PARLEY_KV_WARM=REPSxCONVS (e.g. 10x10)
// runs REPS fresh servers of CONVS conversations each, with one restart
// each, and logs the count of cold turns, for a measurement.

// warmSlack is how many prompt tokens a warm turn may evaluate beyond its
// new ones: a token of margin (a reply's last token is decoded before its
// state is saved, so a warm turn evaluated none beyond them in 200 turns).
const warmSlack = 1

// warmRun is one configuration of the test.
type warmRun struct {
	reps, convs, restarts, turns int
}

// warmConfig is the run CI makes (4 conversations over 2 slots, 3 turns
// each, then 2 rounds of kill -9, restart and one turn each) unless
// PARLEY_KV_WARM asks for a measurement.
func warmConfig(t *testing.T) warmRun {
	t.Helper()
	v := os.Getenv("PARLEY_KV_WARM")
	if v == "" {
		return warmRun{reps: 1, convs: 4, restarts: 2, turns: 3}
	}
	reps, convs, ok := strings.Cut(v, "x")
	r, err1 := strconv.Atoi(reps)
	c, err2 := strconv.Atoi(convs)
	if !ok || err1 != nil || err2 != nil || r < 1 || c < 1 {
		t.Fatalf("PARLEY_KV_WARM: want REPSxCONVS such as 10x10, got %q", v)
	}
	return warmRun{reps: r, convs: c, restarts: 1, turns: 5}
}

func TestKVWarmAfterKill9Bolt(t *testing.T) {
	bin := testbin.Parley(t)
	testKVWarmAfterKill9(t, bin, func() []string { return []string{"--store", "bolt"} })
}

func TestKVWarmAfterKill9Redis(t *testing.T) {
	bin := testbin.Parley(t)
	rds := redistest.Start(t)
	db := 0
	testKVWarmAfterKill9(t, bin, func() []string {
		db++ // a fresh database per repetition (Redis has 16)
		return []string{"--store", rds.URL(db % 16)}
	})
}

// warmConv is one conversation of the test.
type warmConv struct {
	id      string
	carried int // prompt + completion tokens of its last turn: what its saved state holds
}

func testKVWarmAfterKill9(t *testing.T, bin string, store func() []string) {
	cfg := warmConfig(t)
	openings := []string{"Lily found a red ball.", "Tom had a big dog.", "The sun was hot.", "Sam saw a little bird.",
		"Mia went to the park.", "Ben made a cake.", "The cat was sad.", "Anna had a blue hat.",
		"A boy lost his toy.", "The fish swam fast."}
	follow := []string{"What did they do next?", "Who else came?", "Where did they go?", "What happened at the end?",
		"Why was that?", "And then?"}
	var turns, cold, excess int // excess: the most a warm turn evaluated beyond its new tokens
	var evaluatedSum, newSum int
	for rep := range cfg.reps {
		dataDir := t.TempDir()
		args := append([]string{"--data-dir", dataDir, "--ctx", "2048", "--max-tokens", "120", "--parallel", "2"}, store()...)
		s := start(t, bin, args...)
		convs := make([]*warmConv, cfg.convs)
		socks := make([]*websocket.Conn, cfg.convs)
		for i := range convs {
			socks[i] = s.dial(t, "")
			convs[i] = &warmConv{id: read(t, socks[i]).SessionID()}
		}
		// Turns in rounds across the conversations, one at a time: every
		// turn takes a slot from another conversation, whose state is saved.
		for j := range cfg.turns {
			for i, c := range convs {
				prompt := openings[i%len(openings)]
				if j > 0 {
					prompt = follow[(i+j)%len(follow)]
				}
				m := turn(t, socks[i], prompt, nil)
				if m.FinishReason == "error" {
					t.Fatalf("repetition %d, conversation %d, turn %d: %+v", rep, i, j+1, m)
				}
				c.carried = m.Usage.PromptTokens + m.Usage.CompletionTokens
			}
		}
		for r := range cfg.restarts {
			waitKVOnDisk(t, s.addr)
			for _, ws := range socks {
				ws.Close()
			}
			if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var ee *exec.ExitError
			if err := s.wait(t, time.Minute); !errors.As(err, &ee) {
				t.Fatalf("want death by SIGKILL, got %v", err)
			}
			s = start(t, bin, args...)
			coldBefore := cold
			for i, c := range convs {
				socks[i] = s.dial(t, "&session="+c.id)
				if m := read(t, socks[i]); !m.Resumed {
					t.Fatalf("repetition %d, restart %d: conversation %d not resumed: %+v", rep, r+1, i, m)
				}
				m := turn(t, socks[i], follow[(i+r)%len(follow)], nil)
				if m.FinishReason == "error" {
					t.Fatalf("repetition %d, restart %d, conversation %d: %+v", rep, r+1, i, m)
				}
				newTokens := m.Usage.PromptTokens - c.carried
				evaluated := m.Usage.PromptTokens - m.Usage.CachedPromptTokens
				turns++
				evaluatedSum, newSum = evaluatedSum+evaluated, newSum+newTokens
				if evaluated <= newTokens+warmSlack {
					excess = max(excess, evaluated-newTokens)
				} else {
					cold++
					t.Logf("repetition %d, restart %d, conversation %d: cold: evaluated %d of %d prompt tokens (%d new)",
						rep, r+1, i, evaluated, m.Usage.PromptTokens, newTokens)
				}
				c.carried = m.Usage.PromptTokens + m.Usage.CompletionTokens
			}
			// Each warm turn restored its conversation's state.
			if restores, want := metric(t, s.addr, "parley_kv_restores_total"), cfg.convs-(cold-coldBefore); restores < float64(want) {
				t.Errorf("repetition %d, restart %d: parley_kv_restores_total %v, want at least %d", rep, r+1, restores, want)
			}
		}
		s.Kill()
		for _, ws := range socks {
			ws.Close()
		}
	}
	t.Logf("%d of %d turns after a restart were cold (%d repetitions of %d conversations, %d restarts each); the warm ones evaluated at most %d tokens beyond their new ones; %d prompt tokens evaluated for %d new",
		cold, turns, cfg.reps, cfg.convs, cfg.restarts, excess, evaluatedSum, newSum)
	if cold > 0 {
		t.Fatalf("%d of %d turns after a restart evaluated more than their new tokens + %d", cold, turns, warmSlack)
	}
}
