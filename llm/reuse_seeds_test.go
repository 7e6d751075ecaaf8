package llm_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
)

// TestExactTokenReuseSampled is TestExactTokenReuse over many sampled
// conversations, as the defect was measured: 10-turn conversations,
// sampled 160-token replies, --parallel 8, one conversation at a time.
// Before the fix about 1 turn in 20 re-evaluated the whole previous reply
// (a reply whose first token had no leading space, which the plain
// transcript renders after "Assistant: "). Every turn whose prefix was kept
// must evaluate at most its new tokens and the one sampled token never
// decoded.
func TestExactTokenReuseSampled(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 1024, Parallel: 8, Threads: 1})
	r := chat.NewResponder(e)
	checked, bad := 0, 0
	for conv := range 8 {
		p := parley.DefaultParams()
		p.MaxTokens = 160
		p.Seed = int64(100 + conv)
		p.Stop = nil
		key := fmt.Sprintf("conv%d", conv)
		var msgs []parley.Message
		var prev parley.Usage
		prevDropped := 0
		for turn := 1; turn <= 10; turn++ {
			msgs = append(msgs, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("Tell me about the %d little birds.", turn)})
			rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: key, Messages: msgs, Params: p})
			if err != nil {
				t.Fatal(err)
			}
			var final parley.Event
			for ev := range rep.Events() {
				if ev.Done {
					final = ev
				}
			}
			if final.Err != nil {
				t.Fatal(final.Err)
			}
			u := final.Usage
			if turn > 1 && rep.Dropped() == prevDropped {
				checked++
				newTokens := u.PromptTokens - prev.PromptTokens - prev.CompletionTokens
				if evaluated := u.PromptTokens - u.CachedPromptTokens; evaluated > newTokens+1 {
					bad++
					t.Errorf("conversation %d turn %d: evaluated %d prompt tokens, want at most %d; the reply before began %q",
						conv, turn, evaluated, newTokens+1, firstRunes(msgs[len(msgs)-2].Content, 12))
				}
			}
			msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()})
			prev, prevDropped = u, rep.Dropped()
		}
	}
	t.Logf("%d turns checked, %d re-evaluated more than their new tokens", checked, bad)
	if checked < 40 {
		t.Fatalf("only %d turns kept their prefix", checked)
	}
}

func firstRunes(s string, n int) string {
	r := []rune(s)
	return string(r[:min(n, len(r))])
}
