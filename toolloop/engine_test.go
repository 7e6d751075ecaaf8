package toolloop_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/mcptest"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/mcp"
	"github.com/parley-chat/parley/toolloop"
)

// TestLoopThroughLlama runs the whole loop: a real llama.cpp engine with a
// scripted model that calls a server tool, the chat layer that parses the
// call, an MCP server the Manager reaches over HTTP, and the model's answer
// to the result.
func TestLoopThroughLlama(t *testing.T) {
	e, err := llm.Open(llm.Config{Path: testmodel.Scripted(t, synth.ToolCaller()), ContextLength: 2048, Parallel: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	r := chat.NewResponder(e)

	cfg, err := mcp.ParseConfig([]byte(fmt.Sprintf(`{"servers": {"math": {"url": %q, "allow_private": true}}, "users": {"alice": {"math": ["add"]}}}`,
		mcptest.NewAdder(t).URL)), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := mcp.New(cfg)
	t.Cleanup(func() { m.Close() })

	var mu sync.Mutex
	var prompts []string
	reply := func(ctx context.Context, msgs []parley.Message, p parley.Params) (toolloop.Reply, error) {
		rep, err := r.Reply(ctx, parley.ReplyRequest{Key: "conv-1", Messages: msgs, Params: p})
		if err != nil {
			return nil, err
		}
		mu.Lock()
		prompts = append(prompts, rep.Prompt())
		mu.Unlock()
		return rep, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ts, err := toolloop.Build(ctx, m, "alice", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := parley.DefaultParams()
	p.Temperature, p.RepeatPenalty, p.MaxTokens, p.Seed = 0, 1, 100, 1
	evs := collect(t, toolloop.New(reply, m), ctx, toolloop.Request{
		Messages: []parley.Message{{Role: parley.RoleUser, Content: "What is 2 + 40?"}}, Params: p, Tools: ts,
	})
	var calls, results int
	var answer strings.Builder
	for _, ev := range evs {
		switch ev.Kind {
		case toolloop.EventCall:
			calls++
		case toolloop.EventResult:
			results++
			if ev.Call.Output != "42" || ev.Call.Tool.Server != "math" {
				t.Errorf("result = %+v", ev.Call)
			}
		case toolloop.EventToken:
			if ev.Step == 2 {
				answer.WriteString(ev.Model.Token.Text)
			}
		}
	}
	done := evs[len(evs)-1].Done
	if calls != 1 || results != 1 || done.Steps != 2 || done.Final.Finish == parley.FinishError {
		t.Fatalf("calls %d, results %d, steps %d, final %+v", calls, results, done.Steps, done.Final)
	}
	if got := strings.TrimSpace(answer.String()); got != "The server worked it out." {
		t.Errorf("answer = %q", got)
	}
	if len(prompts) != 2 || !strings.Contains(prompts[1], "<|im_start|>tool\n42<|im_end|>") {
		t.Errorf("the second prompt does not hold the result: %q", prompts)
	}
	if n := len(done.Messages); n != 3 || done.Messages[0].ToolCalls[0].Arguments == "" || done.Messages[2].Role != parley.RoleAssistant {
		t.Errorf("messages = %+v", done.Messages)
	}
}
