package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// TestMaxSessionBytesReachesTheStore: --max-session-bytes is the cap of a
// stored conversation's text: a conversation past it keeps its newest turns
// and drops its oldest, and the default keeps them all.
func TestMaxSessionBytesReachesTheStore(t *testing.T) {
	turns := func() []parley.Message {
		var msgs []parley.Message
		for i := range 4 {
			msgs = append(msgs, parley.Message{Role: "user", Content: strings.Repeat(string(rune('a'+i)), 1000)},
				parley.Message{Role: "assistant", Content: "ok"})
		}
		return msgs
	}
	for _, tc := range []struct {
		args []string
		kept int // messages
	}{
		{nil, 8},
		{[]string{"--max-session-bytes", "2500"}, 4},
	} {
		cfg, err := parseFlags(append([]string{"--model", "m.gguf", "--store", "memory", "--data-dir", t.TempDir()}, tc.args...),
			func(string) string { return "" }, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := openStore(cfg, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		id, err := session.NewID()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Put(context.Background(), &session.Session{ID: id, Messages: turns()}); err != nil {
			t.Fatal(err)
		}
		got, err := st.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Messages) != tc.kept || got.Messages[len(got.Messages)-2].Content[0] != 'd' {
			t.Fatalf("%v: kept %d messages, want %d ending with the newest turn", tc.args, len(got.Messages), tc.kept)
		}
	}
}
