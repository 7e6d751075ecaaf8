package servertools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/servertools"
)

// echoHost is one MCP server, "calc", whose one tool echoes its arguments.
type echoHost struct{}

func (echoHost) Servers(string) []string { return []string{"calc"} }
func (echoHost) ListTools(context.Context, string, string) ([]toolloop.RemoteTool, error) {
	return []toolloop.RemoteTool{{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}}, nil
}
func (echoHost) CallTool(_ context.Context, _, _, _ string, args json.RawMessage) (toolloop.Result, error) {
	return toolloop.Result{Content: string(args)}, nil
}

// stepModel answers each step of a run in turn: a call of echo until its
// last step, then text. Step n's prompt is 100*n tokens, n-1 turns dropped.
type stepModel struct {
	mu    sync.Mutex
	steps int
	last  int // the step that answers with text
}

func (m *stepModel) Reply(_ context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	m.mu.Lock()
	m.steps++
	n := m.steps
	m.mu.Unlock()
	r := &stepReply{events: make(chan parley.Event, 4), done: make(chan struct{}), n: n}
	final := parley.Event{Done: true, Finish: parley.FinishStop, Usage: parley.Usage{PromptTokens: 100 * n, CompletionTokens: 1}}
	if n < m.last {
		call := parley.ToolCall{ID: fmt.Sprintf("call_%d", n), Name: "echo", Arguments: `{"n":1}`}
		r.events <- parley.Event{ToolCall: &parley.ToolCallDelta{ID: call.ID, Name: call.Name, Arguments: call.Arguments}}
		final.Finish, final.ToolCalls = parley.FinishToolCalls, []parley.ToolCall{call}
	} else {
		r.events <- parley.Event{Token: parley.Token{Text: "done"}}
	}
	r.events <- final
	close(r.events)
	close(r.done)
	return r, nil
}

func (m *stepModel) Complete(context.Context, parley.ReplyRequest) (parley.Reply, error) {
	return nil, parley.Errorf(parley.EInvalid, "no raw prompts")
}

// stepReply is step n's reply: its prompt describes the step.
type stepReply struct {
	events chan parley.Event
	done   chan struct{}
	n      int
}

func (r *stepReply) Events() <-chan parley.Event { return r.events }
func (r *stepReply) Done() <-chan struct{}       { return r.done }
func (r *stepReply) Text() string                { return "" }
func (r *stepReply) Reasoning() string           { return "" }
func (r *stepReply) Prompt() string              { return fmt.Sprintf("prompt of step %d", r.n) }
func (r *stepReply) PromptTokens() int           { return 100 * r.n }
func (r *stepReply) Dropped() int                { return r.n - 1 }
func (r *stepReply) StopSequence() string        { return "" }

// TestReplyReportsLastStepPrompt: a run's reply reports the prompt of its
// latest step (its tokens and dropped turns): the first step's while the
// run starts, the last step's once it has ended; the final usage still sums
// every step.
func TestReplyReportsLastStepPrompt(t *testing.T) {
	ctx := context.Background()
	ts, err := toolloop.Build(ctx, echoHost{}, "", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	model := &stepModel{last: 3}
	lr := servertools.NewResponder(model, echoHost{}, ts, nil)
	rep, err := lr.Reply(ctx, parley.ReplyRequest{Messages: []parley.Message{{Role: parley.RoleUser, Content: "go"}}, Params: parley.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	if n := rep.PromptTokens(); n != 100 && n != 200 && n != 300 {
		t.Errorf("PromptTokens as the run starts = %d, want a step's (100, 200 or 300)", n)
	}
	var final parley.Event
	for ev := range rep.Events() {
		if ev.Done {
			final = ev
		}
	}
	<-rep.Done()
	if final.Finish != parley.FinishStop || final.Usage.PromptTokens != 600 {
		t.Fatalf("final event %+v, want a stop with the prompts of three steps (600 tokens)", final)
	}
	if n := rep.PromptTokens(); n != 300 {
		t.Errorf("PromptTokens = %d, want 300 (the last step's prompt)", n)
	}
	if n := rep.Dropped(); n != 2 {
		t.Errorf("Dropped = %d, want 2 (the last step's)", n)
	}
	if p := rep.Prompt(); p != "prompt of step 3" {
		t.Errorf("Prompt = %q, want the last step's", p)
	}
}
