package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
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
	waitKVOnDisk(t, s.addr)
	if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := s.wait(t, hangWait); !errors.As(err, &ee) {
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

// response is what the Responses test reads of a response.
type response struct {
	ID    string `json:"id"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func createResponse(t *testing.T, addr string, body map[string]any) response {
	t.Helper()
	b, _ := json.Marshal(body)
	res, err := http.Post("http://"+addr+"/v1/responses", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var r response
	if res.StatusCode != http.StatusOK || json.Unmarshal(raw, &r) != nil || r.ID == "" {
		t.Fatalf("POST /v1/responses: %d %s", res.StatusCode, raw)
	}
	return r
}

// waitKVOnDisk waits until the last turn's state is on disk: the server
// saves at idle (50 ms after the last request), so no slot is left unsaved,
// nothing is queued for the disk, and a file was written.
func waitKVOnDisk(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(hangWait)
	for metric(t, addr, "parley_kv_unsaved_slots") != 0 || metric(t, addr, "parley_kv_disk_pending") != 0 ||
		metric(t, addr, "parley_kv_disk_writes_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the KV state was not written: %v files, %v slots unsaved", metric(t, addr, "parley_kv_disk_writes_total"),
				metric(t, addr, "parley_kv_unsaved_slots"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The Responses API's previous_response_id after kill -9: the chained
// response is prompted from the restored state, and its
// input_tokens_details.cached_tokens counts the restored tokens.
func TestKVStateSurvivesKill9Responses(t *testing.T) {
	bin := testbin.Parley(t)
	args := []string{"--store", "bolt", "--data-dir", t.TempDir(), "--parallel", "1"}
	s := start(t, bin, args...)
	r := createResponse(t, s.addr, map[string]any{"input": "Lily found a red ball.", "max_output_tokens": 60})
	r = createResponse(t, s.addr, map[string]any{"input": "What did she do with it?", "previous_response_id": r.ID, "max_output_tokens": 60})
	waitKVOnDisk(t, s.addr)
	s.Cmd.Process.Signal(syscall.SIGKILL)
	s.wait(t, hangWait)

	s2 := start(t, bin, args...)
	next := createResponse(t, s2.addr, map[string]any{"input": "Who came to play?", "previous_response_id": r.ID, "max_output_tokens": 20})
	carried := r.Usage.InputTokens + r.Usage.OutputTokens // the reply's last token was decoded before the save
	if c := next.Usage.InputTokensDetails.CachedTokens; c < carried {
		t.Fatalf("cached_tokens %d after the restart, want at least %d (usage %+v)", c, carried, next.Usage)
	}
}
