package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
)

// TestBackgroundResponseSurvivesKill9: a background response that is
// generating when the process dies (kill -9) is found after a restart on
// the same data directory, stored as interrupted, not lost.
func TestBackgroundResponseSurvivesKill9(t *testing.T) {
	bin := testbin.Parley(t)
	dataDir := t.TempDir()
	args := []string{"--store", "bolt", "--data-dir", dataDir}
	s := start(t, bin, args...)
	var got struct {
		Status            string `json:"status"`
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
		Output []struct {
			Status string `json:"status"`
		} `json:"output"`
	}
	// The kill lands after the first token, but the server may have
	// generated the whole reply by then: such a try finds the response
	// completed after the restart, and the test tries again.
	for try := 1; ; try++ {
		base := "http://" + s.addr + "/v1/responses"
		// A grammar that keeps the tiny model busy for a while.
		body := `{"input": "Tell me everything", "background": true, "max_output_tokens": 400, "grammar": "root ::= [a-z ]{400,}"}`
		res, err := http.Post(base, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var created struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		err = json.NewDecoder(res.Body).Decode(&created)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK || created.Status != "in_progress" {
			t.Fatalf("create: %d %+v %v", res.StatusCode, created, err)
		}
		// Wait for its first token on its event stream, then kill.
		stream, err := http.Get(base + "/" + created.ID + "?stream=true")
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stream.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), "response.output_text.delta") {
		}
		if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var ee *exec.ExitError
		if err := s.wait(t, hangWait); !errors.As(err, &ee) {
			t.Fatalf("want death by SIGKILL, got %v", err)
		}
		stream.Body.Close()

		s = start(t, bin, args...)
		res, err = http.Get("http://" + s.addr + "/v1/responses/" + created.ID)
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(res.Body).Decode(&got)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET after the restart: %d %v", res.StatusCode, err)
		}
		if got.Status != "completed" {
			break
		}
		if try == 5 {
			t.Fatalf("in %d tries the server finished the response before the kill each time", try)
		}
		t.Logf("try %d: the response was complete before the kill; again", try)
	}
	if got.Status != "incomplete" || got.IncompleteDetails == nil || got.IncompleteDetails.Reason != "interrupted" ||
		len(got.Output) != 1 || got.Output[0].Status != "incomplete" {
		t.Fatalf("after kill -9 the response is %+v, want incomplete (interrupted)", got)
	}
}
