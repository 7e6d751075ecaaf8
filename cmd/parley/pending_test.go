package main

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/internal/testbin"
)

// A chat turn is stored before its reply and its reply so far at
// checkpoints: the binary is killed (kill -9) while a reply
// streams, started again on the same store, and the conversation holds
// the prompt and the reply up to at least the last checkpoint the client
// had seen (32 tokens of 40), marked interrupted; Regenerate replaces it.
// A try in which the server finished the reply before the kill is made
// again.
// On bbolt and on Redis.

func TestChatTurnSurvivesKill9Bolt(t *testing.T) {
	bin := testbin.Parley(t)
	testChatTurnSurvivesKill9(t, bin, []string{"--store", "bolt", "--data-dir", t.TempDir()})
}

func TestChatTurnSurvivesKill9Redis(t *testing.T) {
	bin := testbin.Parley(t)
	rds := redistest.Start(t)
	testChatTurnSurvivesKill9(t, bin, []string{"--store", rds.URL(0), "--data-dir", t.TempDir()})
}

func testChatTurnSurvivesKill9(t *testing.T, bin string, args []string) {
	const (
		seen       = 40 // tokens the client reads before the kill
		checkpoint = 32 // the last checkpoint at or before them (session/pending.go)
		prompt     = "Tell me everything"
		full       = 400 // the reply's tokens, each at least one letter or space
		tries      = 5
	)
	// The kill lands after the client read its tokens, but the server may
	// have generated the whole reply by then (it is not held back by a
	// slow reader): such a try shows the reply complete after the restart,
	// and the test tries again in a new conversation, until a kill lands
	// mid-reply.
	s := start(t, bin, args...)
	var id string
	var texts []string
	var open jsonmode.Message
	for try := 1; ; try++ {
		ws := s.dial(t, "")
		id = read(t, ws).SessionID()
		// A grammar that keeps the tiny model going well past what is read.
		ws.WriteJSON(map[string]any{"type": "prompt", "content": prompt,
			"params": map[string]any{"max_tokens": full, "grammar": "root ::= [a-z ]{400,}"}})
		texts = texts[:0]
		for len(texts) < seen {
			m := read(t, ws)
			if m.Type != "token" {
				t.Fatalf("token %d of the reply: %+v", len(texts)+1, m)
			}
			texts = append(texts, m.Text)
		}
		if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var ee *exec.ExitError
		if err := s.wait(t, time.Minute); !errors.As(err, &ee) {
			t.Fatalf("want death by SIGKILL, got %v", err)
		}
		ws.Close()

		s = start(t, bin, args...)
		ws = s.dial(t, "&session="+id)
		open = read(t, ws)
		ws.Close()
		if !open.Resumed || open.Reply != nil || len(open.Messages) != 2 {
			t.Fatalf("after kill -9 and a restart: %+v", open)
		}
		if r := open.Messages[1]; r.Interrupted || len(r.Content) < full {
			break
		}
		if try == tries {
			t.Fatalf("in %d tries the server finished the reply before the kill each time", tries)
		}
		t.Logf("try %d: the reply was complete before the kill; again", try)
	}
	ws := s.dial(t, "&session="+id)
	read(t, ws)
	user, reply := open.Messages[0], open.Messages[1]
	atCheckpoint := strings.Join(texts[:checkpoint], "")
	if user.Role != "user" || user.Content != prompt {
		t.Fatalf("the prompt after the restart: %+v", user)
	}
	if reply.Role != "assistant" || !reply.Interrupted || !strings.HasPrefix(reply.Content, atCheckpoint) {
		t.Fatalf("the reply after the restart: %+v\nwant it interrupted, starting with the %d tokens %q", reply, checkpoint, atCheckpoint)
	}
	t.Logf("the client had %d tokens; the store kept %d bytes of the reply (%d at the checkpoint)",
		seen, len(reply.Content), len(atCheckpoint))

	// Regenerate replaces the interrupted reply.
	ws.WriteJSON(map[string]any{"type": "regenerate", "params": map[string]any{"max_tokens": 8}})
	for {
		m := read(t, ws)
		if m.Type == "token" {
			continue
		}
		if m.Type != "done" || m.FinishReason == "error" {
			t.Fatalf("regenerate: %+v", m)
		}
		break
	}
	ws.Close()
	ws = s.dial(t, "&session="+id)
	open = read(t, ws)
	if len(open.Messages) != 2 || open.Messages[0].Content != prompt || open.Messages[1].Interrupted || open.Messages[1].Content == "" {
		t.Fatalf("after regenerate: %+v", open.Messages)
	}
}
