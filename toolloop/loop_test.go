package toolloop_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/paramstest"
	"github.com/parley-chat/parley/toolloop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeHost serves two servers: "calc" (add, and a tool that fails) and
// "web" (fetch, whose name collides with a client tool in some tests).
type fakeHost struct {
	mu    sync.Mutex
	calls []string
	down  bool // "web" cannot list its tools
}

func (h *fakeHost) Servers(user string) []string {
	if user == "guest" {
		return []string{"calc"}
	}
	return []string{"calc", "web"}
}

func (h *fakeHost) ListTools(ctx context.Context, _, server string) ([]toolloop.RemoteTool, error) {
	obj := json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}}`)
	switch server {
	case "calc":
		return []toolloop.RemoteTool{
			{Name: "add", Description: "adds", InputSchema: obj},
			{Name: "fail", InputSchema: obj},
			{Name: "liar", InputSchema: json.RawMessage(`{"type":"string"}`)}, // not an object: left out
			{Name: "dotted.name", InputSchema: obj},
		}, nil
	case "web":
		if h.down {
			return nil, errors.New("connection refused")
		}
		return []toolloop.RemoteTool{{Name: "fetch", InputSchema: json.RawMessage(`{"type":"object","properties":{"url":{"type":"string"}}}`)}}, nil
	}
	return nil, errors.New("no such server")
}

func (h *fakeHost) CallTool(ctx context.Context, _, server, tool string, args json.RawMessage) (toolloop.Result, error) {
	h.mu.Lock()
	h.calls = append(h.calls, server+"/"+tool+" "+string(args))
	h.mu.Unlock()
	switch tool {
	case "add":
		var a struct{ A, B int }
		if err := json.Unmarshal(args, &a); err != nil {
			return toolloop.Result{}, err
		}
		return toolloop.Result{Content: fmt.Sprint(a.A + a.B)}, nil
	case "fail":
		return toolloop.Result{}, errors.New("mcp server \"calc\" did not answer within 1s")
	}
	return toolloop.Result{Content: "ok " + tool}, nil
}

// script is a model that answers with its replies in turn: a reply is
// text, or tool calls ("name {args}" lines prefixed with "call:").
type script struct {
	mu      sync.Mutex
	replies []string
	seen    [][]parley.Message
	params  []parley.Params
}

type fakeReply chan parley.Event

func (r fakeReply) Events() <-chan parley.Event { return r }

func (s *script) reply(ctx context.Context, msgs []parley.Message, p parley.Params) (toolloop.Reply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, append([]parley.Message(nil), msgs...))
	s.params = append(s.params, p)
	if len(s.replies) == 0 {
		return nil, parley.Errorf(parley.EInvalid, "script: no more replies")
	}
	text := s.replies[0]
	s.replies = s.replies[1:]
	ch := make(fakeReply, 16)
	final := parley.Event{Done: true, Finish: parley.FinishStop, Usage: parley.Usage{PromptTokens: 10, CompletionTokens: 2}}
	if calls, ok := strings.CutPrefix(text, "call:"); ok {
		for i, line := range strings.Split(calls, "\n") {
			name, args, _ := strings.Cut(line, " ")
			id := fmt.Sprintf("call_%d_%d", len(s.seen), i)
			ch <- parley.Event{Token: parley.Token{Text: ""}, ToolCall: &parley.ToolCallDelta{Index: i, ID: id, Name: name, Arguments: args}}
			final.ToolCalls = append(final.ToolCalls, parley.ToolCall{ID: id, Name: name, Arguments: args})
		}
		final.Finish = parley.FinishToolCalls
	} else {
		ch <- parley.Event{Token: parley.Token{Text: text}}
	}
	ch <- final
	close(ch)
	return ch, nil
}

func params(tools ...parley.Tool) parley.Params {
	p := parley.DefaultParams()
	p.Tools = tools
	return p
}

// collect runs req to its end and returns its events.
func collect(t *testing.T, l *toolloop.Loop, ctx context.Context, req toolloop.Request) []toolloop.Event {
	t.Helper()
	run, err := l.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var evs []toolloop.Event
	for ev := range run.Events() {
		evs = append(evs, ev)
	}
	if n := len(evs); n == 0 || evs[n-1].Kind != toolloop.EventDone {
		t.Fatalf("the run did not end with EventDone: %d events", n)
	}
	return evs
}

func kinds(evs []toolloop.Event) string {
	names := map[toolloop.EventKind]string{toolloop.EventToken: "tok", toolloop.EventReplyDone: "reply", toolloop.EventCall: "call",
		toolloop.EventResult: "result", toolloop.EventApproval: "approval", toolloop.EventDone: "done"}
	var out []string
	for _, e := range evs {
		out = append(out, names[e.Kind])
	}
	return strings.Join(out, " ")
}

func userMsg(text string) []parley.Message {
	return []parley.Message{{Role: parley.RoleUser, Content: text}}
}

func TestLoopCallsServerToolAndContinues(t *testing.T) {
	ctx := context.Background()
	host := &fakeHost{}
	ts, err := toolloop.Build(ctx, host, "", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := &script{replies: []string{`call:add {"a":2,"b":3}`, "The sum is 5."}}
	evs := collect(t, toolloop.New(sc.reply, host), ctx, toolloop.Request{Messages: userMsg("2+3?"), Params: params(), Tools: ts})
	if got, want := kinds(evs), "tok reply call result tok reply done"; got != want {
		t.Fatalf("events = %q, want %q", got, want)
	}
	if !evs[0].Server {
		t.Error("the add call's delta is not marked as a server tool's")
	}
	res := evs[3].Call
	if res.Output != "5" || res.Error != "" || res.Tool.Server != "calc" || res.Tool.Remote != "add" {
		t.Errorf("result = %+v", res)
	}
	done := evs[len(evs)-1].Done
	if done.Final.Finish != parley.FinishStop || done.Steps != 2 || done.Final.Usage.PromptTokens != 20 {
		t.Errorf("done = %+v", done.Final)
	}
	// What the run appended: the call, its result, the answer.
	if len(done.Messages) != 3 || done.Messages[0].ToolCalls[0].Name != "add" ||
		done.Messages[1].Role != parley.RoleTool || done.Messages[1].Content != "5" || done.Messages[1].ToolCallID != done.Messages[0].ToolCalls[0].ID ||
		done.Messages[2].Content != "The sum is 5." {
		t.Errorf("messages = %+v", done.Messages)
	}
	// The second reply saw the result.
	if second := sc.seen[1]; len(second) != 3 || second[2].Content != "5" {
		t.Errorf("the model's second prompt = %+v", second)
	}
	// The tools the model was offered: the server tools, named for it.
	var names []string
	for _, tl := range sc.params[0].Tools {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); got != "add,fail,calc__dotted_name,fetch" {
		t.Errorf("tools offered = %s", got)
	}
	if ts.Skipped() != 1 {
		t.Errorf("skipped = %d, want 1 (the tool whose schema is not an object)", ts.Skipped())
	}
}

func TestLoopClientToolsPassThrough(t *testing.T) {
	ctx := context.Background()
	host := &fakeHost{}
	client := parley.Tool{Name: "fetch", Parameters: json.RawMessage(`{"type":"object"}`)}
	ts, err := toolloop.Build(ctx, host, "", toolloop.Selection{All: true}, []parley.Tool{client})
	if err != nil {
		t.Fatal(err)
	}
	// The server's fetch is renamed: the client's keeps its name.
	if tl, ok := ts.Lookup("web__fetch"); !ok || tl.Remote != "fetch" {
		t.Fatalf("web's fetch is not web__fetch: %+v", ts.Tools())
	}
	if _, ok := ts.Lookup("fetch"); ok {
		t.Fatal("the client's fetch is taken for a server tool")
	}
	sc := &script{replies: []string{"call:add {\"a\":1,\"b\":1}\nfetch {\"u\":1}"}}
	evs := collect(t, toolloop.New(sc.reply, host), ctx, toolloop.Request{Messages: userMsg("go"), Params: params(client), Tools: ts})
	done := evs[len(evs)-1].Done
	if done.Final.Finish != parley.FinishToolCalls || len(done.ClientCalls) != 1 || done.ClientCalls[0].Name != "fetch" {
		t.Fatalf("done = %+v", done)
	}
	if len(host.calls) != 1 || !strings.HasPrefix(host.calls[0], "calc/add") {
		t.Errorf("host calls = %v (the client's fetch must not reach it)", host.calls)
	}
	// The assistant turn holds both calls, and the server's result follows it.
	if len(done.Messages) != 2 || len(done.Messages[0].ToolCalls) != 2 || done.Messages[1].Content != "2" {
		t.Errorf("messages = %+v", done.Messages)
	}
	if evs[1].Server == evs[0].Server {
		t.Error("the server call and the client call are marked alike")
	}
	// The stored turn marks the server's call, not the client's; the final
	// event's calls stay the model's.
	if sc := done.Messages[0].ToolCalls[0].Server; sc == nil || sc.Label != "calc" || sc.Tool != "add" || sc.Approval {
		t.Errorf("server call marked %+v", sc)
	}
	if done.Messages[0].ToolCalls[1].Server != nil || done.ClientCalls[0].Server != nil || done.Final.ToolCalls[0].Server != nil {
		t.Error("the client's call is marked as a server call")
	}
}

func TestLoopStepLimitEndsWithAnswer(t *testing.T) {
	ctx := context.Background()
	host := &fakeHost{}
	ts, _ := toolloop.Build(ctx, host, "", toolloop.Selection{All: true}, nil)
	sc := &script{replies: []string{`call:add {"a":1,"b":1}`, `call:add {"a":1,"b":2}`, "done"}}
	evs := collect(t, toolloop.New(sc.reply, host), ctx, toolloop.Request{Messages: userMsg("go"), Params: params(), Tools: ts, MaxSteps: 3})
	done := evs[len(evs)-1].Done
	if done.Steps != 3 || done.Final.Finish != parley.FinishStop {
		t.Fatalf("done = %+v", done)
	}
	if len(sc.params[2].Tools) != 0 || sc.params[2].ToolsActive() {
		t.Errorf("the last step offered tools: %+v", sc.params[2].Tools)
	}
	if len(sc.params[1].Tools) == 0 {
		t.Error("the second step offered no tools")
	}
}

func TestLoopFailedCallReachesModel(t *testing.T) {
	ctx := context.Background()
	host := &fakeHost{}
	ts, _ := toolloop.Build(ctx, host, "", toolloop.Selection{All: true}, nil)
	sc := &script{replies: []string{`call:fail {}`, "sorry"}}
	evs := collect(t, toolloop.New(sc.reply, host), ctx, toolloop.Request{Messages: userMsg("go"), Params: params(), Tools: ts})
	res := evs[3].Call
	if evs[3].Kind != toolloop.EventResult || !strings.Contains(res.Error, "did not answer") || !strings.HasPrefix(res.Output, "error: ") {
		t.Fatalf("result = %+v", res)
	}
	if sc.seen[1][2].Content != res.Output {
		t.Errorf("the model read %q, not the error", sc.seen[1][2].Content)
	}
	// The stored result keeps the error, for a stored record to show.
	if done := evs[len(evs)-1].Done; done.Messages[1].ToolError != res.Error {
		t.Errorf("stored result %+v, error %q", done.Messages[1], res.Error)
	}
}

func TestLoopApprovalRoundTrip(t *testing.T) {
	ctx := context.Background()
	host := &fakeHost{}
	sel := toolloop.Selection{Servers: []toolloop.MCPSpec{{ServerLabel: "calc", AllowedTools: []string{"add"}}}} // approval: always (the zero value)
	ts, err := toolloop.Build(ctx, host, "", sel, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(ts.Tools()); got != 1 {
		t.Fatalf("allowed_tools left %d tools, want 1", got)
	}
	sc := &script{replies: []string{`call:add {"a":4,"b":4}`, "eight", `call:add {"a":1,"b":1}`}}
	l := toolloop.New(sc.reply, host)
	evs := collect(t, l, ctx, toolloop.Request{Messages: userMsg("4+4"), Params: params(), Tools: ts})
	if got, want := kinds(evs), "tok reply approval done"; got != want {
		t.Fatalf("events = %q, want %q", got, want)
	}
	done := evs[len(evs)-1].Done
	if done.Final.Finish != toolloop.FinishApproval || len(done.Approvals) != 1 || len(host.calls) != 0 {
		t.Fatalf("done = %+v, calls %v", done, host.calls)
	}
	ap := done.Approvals[0]
	if ap.Tool.Server != "calc" || ap.Tool.Remote != "add" || ap.Arguments != `{"a":4,"b":4}` {
		t.Errorf("approval = %+v", ap)
	}

	// The next request: the conversation with the call, and the approval.
	msgs := append(userMsg("4+4"), done.Messages...)
	evs = collect(t, l, ctx, toolloop.Request{Messages: msgs, Params: params(), Tools: ts, Approvals: map[string]bool{ap.ID: true}})
	if got, want := kinds(evs), "call result tok reply done"; got != want {
		t.Fatalf("after approval: events = %q, want %q", got, want)
	}
	if len(host.calls) != 1 || evs[1].Call.Output != "8" {
		t.Errorf("after approval: calls %v, result %+v", host.calls, evs[1].Call)
	}

	// A declined call is answered without calling, and the model goes on.
	evs = collect(t, l, ctx, toolloop.Request{Messages: userMsg("1+1"), Params: params(), Tools: ts})
	ap = evs[len(evs)-1].Done.Approvals[0]
	msgs = append(userMsg("1+1"), evs[len(evs)-1].Done.Messages...)
	sc.replies = append(sc.replies, "fine")
	evs = collect(t, l, ctx, toolloop.Request{Messages: msgs, Params: params(), Tools: ts, Approvals: map[string]bool{ap.ID: false}})
	done = evs[len(evs)-1].Done
	if len(host.calls) != 1 || done.Messages[0].Role != parley.RoleTool || !strings.Contains(done.Messages[0].Content, "declined") {
		t.Errorf("declined: calls %v, messages %+v", host.calls, done.Messages)
	}
}

func TestBuildPolicyAndErrors(t *testing.T) {
	host := &fakeHost{down: true}
	_, err := toolloop.Build(context.Background(), host, "guest", toolloop.Selection{Servers: []toolloop.MCPSpec{{ServerLabel: "web"}}}, nil)
	if parley.ErrorCode(err) != parley.EInvalid {
		t.Fatalf("a server the user may not use: err = %v", err)
	}
	ts, err := toolloop.Build(context.Background(), host, "", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var webErr error
	for _, st := range ts.Servers() {
		if st.Label == "web" {
			webErr = st.Err
		}
	}
	if webErr == nil {
		t.Error("a server that cannot list its tools reports no error")
	}
	if _, ok := ts.Find("calc", "add"); !ok {
		t.Error("Find(calc, add) found nothing")
	}
	// Too many client tools with the server's.
	var many []parley.Tool
	for i := range parley.MaxTools {
		many = append(many, parley.Tool{Name: fmt.Sprintf("t%d", i)})
	}
	if _, err := toolloop.Build(context.Background(), host, "", toolloop.Selection{All: true}, many); parley.ErrorCode(err) != parley.EInvalid {
		t.Errorf("over MaxTools: err = %v", err)
	}
}

func TestApprovalRequires(t *testing.T) {
	cases := []struct {
		a    toolloop.Approval
		tool string
		want bool
	}{
		{toolloop.Approval{}, "x", true},
		{toolloop.Approval{Mode: toolloop.ApprovalNever}, "x", false},
		{toolloop.Approval{Mode: toolloop.ApprovalNever, Always: []string{"x"}}, "x", true},
		{toolloop.Approval{Never: []string{"x"}}, "x", false},
		{toolloop.Approval{Never: []string{"x"}}, "y", true},
	}
	for _, c := range cases {
		if got := c.a.Requires(c.tool); got != c.want {
			t.Errorf("%+v.Requires(%q) = %v, want %v", c.a, c.tool, got, c.want)
		}
	}
}

func TestLoopReaderLeaves(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	host := &fakeHost{}
	ts, _ := toolloop.Build(ctx, host, "", toolloop.Selection{All: true}, nil)
	sc := &script{replies: []string{`call:add {"a":1,"b":1}`, "x"}}
	run, err := toolloop.New(sc.reply, host).Start(ctx, toolloop.Request{Messages: userMsg("go"), Params: params(), Tools: ts})
	if err != nil {
		t.Fatal(err)
	}
	<-run.Events()
	cancel()
	for range run.Events() { // closes: the run's goroutine ends (goleak checks)
	}
}

// TestLoopForcedCallValidatedOnce: a forced call is the first step's; the
// later steps choose freely with the params validated at Start, not
// validated again, and with the call grammar of every tool.
func TestLoopForcedCallValidatedOnce(t *testing.T) {
	ctx := context.Background()
	host := &fakeHost{}
	ts, err := toolloop.Build(ctx, host, "", toolloop.Selection{All: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := &script{replies: []string{`call:add {"a":2,"b":3}`, `call:add {"a":5,"b":1}`, "The sum is 6."}}
	p := params()
	p.ToolChoice = parley.ToolChoice{Mode: parley.ToolFunction, Name: "add"}
	evs := collect(t, toolloop.New(sc.reply, host), ctx, toolloop.Request{Messages: userMsg("2+3+1?"), Params: p, Tools: ts})
	if done := evs[len(evs)-1].Done; done.Steps != 3 || done.Final.Finish != parley.FinishStop {
		t.Fatalf("done = %+v", done)
	}
	first := paramstest.Validations(&sc.params[0])
	if g, _, ok := sc.params[0].CheckedGrammar(); !ok || !sc.params[0].ToolsForced() || strings.Contains(g, "fetch") {
		t.Errorf("the first step's params: forced %v, checked %v, grammar offers other tools: %v", sc.params[0].ToolsForced(), ok, strings.Contains(g, "fetch"))
	}
	for i, sp := range sc.params[1:] {
		if sp.ToolChoice.Mode != parley.ToolAuto {
			t.Errorf("step %d: tool choice %+v, want auto", i+2, sp.ToolChoice)
		}
		if n := paramstest.Validations(&sp); n != first {
			t.Errorf("step %d: params validated %d times, want %d (the first step's): a changed choice is no new validation", i+2, n, first)
		}
		sp.ToolSyntax = parley.ToolSyntax{Trigger: "<tool_call>", Open: "<tool_call>"}
		if err := sp.SetToolSyntax(sp.ToolSyntax); err != nil {
			t.Fatal(err)
		}
		if _, g, ok := sp.LazyToolGrammar(); !ok || !strings.Contains(g, "fetch") || !strings.Contains(g, "add") {
			t.Errorf("step %d: lazy grammar %v does not offer every tool:\n%s", i+2, ok, g)
		}
	}
}
