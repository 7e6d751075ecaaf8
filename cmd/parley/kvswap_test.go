package main

import (
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testbin"
)

// metric returns the value of one sample of /metrics (its name with its
// labels, as printed), or -1 when it is absent.
func metric(t *testing.T, addr, sample string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(metricsText(t, addr))
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// After kill -9 and a restart on the same data directory, the next turn of
// a long conversation evaluates only its new tokens: the session's KV state
// was written to --data-dir/kvcache when the server went idle after each
// turn, and the new process restores it.
func TestKVStateSurvivesKill9(t *testing.T) {
	bin := testbin.Parley(t)
	dataDir := t.TempDir()
	args := []string{"--store", "bolt", "--data-dir", dataDir, "--max-tokens", "60", "--parallel", "2"}
	s := start(t, bin, args...)
	ws := s.dial(t, "")
	open := read(t, ws)
	prompts := []string{"Lily found a red ball.", "What did she do with it?", "Who else came to play?", "Where did they go after that?"}
	var last struct{ prompt, completion int }
	for i, p := range prompts {
		m := turn(t, ws, p, nil)
		if m.FinishReason == "error" {
			t.Fatalf("turn %d: %+v", i+1, m)
		}
		last.prompt, last.completion = m.Usage.PromptTokens, m.Usage.CompletionTokens
	}
	// Each turn's state reaches the disk once the server is idle.
	deadline := time.Now().Add(20 * time.Second)
	for metric(t, s.addr, "parley_kv_disk_writes_total") < float64(len(prompts)) {
		if time.Now().After(deadline) {
			t.Fatalf("the KV state was not written: %v files", metric(t, s.addr, "parley_kv_disk_writes_total"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := s.wait(t, 10*time.Second); !errors.As(err, &ee) {
		t.Fatalf("want death by SIGKILL, got %v", err)
	}

	s2 := start(t, bin, args...)
	ws2 := s2.dial(t, "&session="+open.SessionID())
	if m := read(t, ws2); !m.Resumed || len(m.Messages) != 2*len(prompts) {
		t.Fatalf("after kill -9: %+v", m)
	}
	next := turn(t, ws2, "And what happened at the end?", nil)
	if next.FinishReason == "error" {
		t.Fatalf("turn after the restart: %+v", next)
	}
	carried := last.prompt + last.completion
	newTokens := next.Usage.PromptTokens - carried
	evaluated := next.Usage.PromptTokens - next.Usage.CachedPromptTokens
	t.Logf("after the restart: prompt %d tokens, %d of them restored, %d evaluated (%d new)",
		next.Usage.PromptTokens, next.Usage.CachedPromptTokens, evaluated, newTokens)
	if evaluated > newTokens+2 {
		t.Fatalf("evaluated %d prompt tokens after the restart, want at most the %d new ones + 2", evaluated, newTokens)
	}
	if r := metric(t, s2.addr, "parley_kv_restores_total"); r != 1 {
		t.Fatalf("parley_kv_restores_total %v, want 1", r)
	}
}
