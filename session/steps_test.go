package session_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// stepsReply is a fakeReply that says it ran a server tool before its
// final reply (session.StepsReply).
type stepsReply struct {
	*fakeReply
	steps []parley.Message
}

func (r stepsReply) Steps() []parley.Message { return r.steps }

// stepsResponder answers through f, its replies saying they ran steps.
type stepsResponder struct {
	f     *fakeResponder
	steps []parley.Message
}

func (s stepsResponder) Reply(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	r, err := s.f.Reply(ctx, req)
	if err != nil {
		return nil, err
	}
	return stepsReply{r.(*fakeReply), s.steps}, nil
}

func (s stepsResponder) Complete(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	return s.f.Complete(ctx, req)
}

// TestRespondCommitsSteps: a Responses turn that replies through its own
// Responder, whose reply is a StepsReply, stores its input, the steps (a
// server call and its result) and the reply in order; its record counts the
// steps, so the response's reply and input items stay where they are, and
// a later turn continues after the reply. A chat turn given the Responder
// through ReplyWith stores them the same way.
func TestRespondCommitsSteps(t *testing.T) {
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, f := newService(t, st, echo)
	steps := []parley.Message{
		{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "call_1", Name: "add", Arguments: `{"a":1}`}}},
		{Role: parley.RoleTool, ToolCallID: "call_1", Name: "add", Content: "2"},
	}
	loop := stepsResponder{f, steps}
	ctx := context.Background()
	resp, err := svc.Respond(ctx, parley.Caller{}, session.ResponseRequest{Input: []parley.Message{{Role: parley.RoleUser, Content: "one plus one"}},
		Params: parley.DefaultParams(), Responder: loop})
	if err != nil {
		t.Fatal(err)
	}
	for range resp.Events() {
	}
	rec := resp.Final()
	if rec.Steps != 2 || rec.End-rec.Start != 4 {
		t.Fatalf("record %+v", rec)
	}
	got, sess, err := svc.GetResponse(ctx, parley.Caller{}, rec.ID)
	if err != nil || got.ID != rec.ID {
		t.Fatalf("get response: %+v, %v", got, err)
	}
	var roles []parley.Role
	for _, m := range sess.Messages {
		roles = append(roles, m.Role)
	}
	want := []parley.Role{parley.RoleUser, parley.RoleAssistant, parley.RoleTool, parley.RoleAssistant}
	if len(roles) != len(want) || sess.Messages[1].ToolCalls[0].ID != "call_1" || sess.Messages[3].Content != "reply to one plus one" {
		t.Fatalf("stored %+v", sess.Messages)
	}
	for i := range want {
		if roles[i] != want[i] {
			t.Fatalf("stored roles %v, want %v", roles, want)
		}
	}
	if in := sess.Span(rec.Start, rec.End-1-rec.Steps); len(in) != 1 || in[0].Role != parley.RoleUser {
		t.Errorf("input span %+v", in)
	}

	// The next turn continues after the reply, through the Service's own Responder.
	next, err := svc.Respond(ctx, parley.Caller{}, session.ResponseRequest{Previous: rec.ID, Input: []parley.Message{{Role: parley.RoleUser, Content: "thanks"}},
		Params: parley.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	for range next.Events() {
	}
	if n := next.Final(); n.Steps != 0 || n.Start != rec.End || n.End != rec.End+2 {
		t.Errorf("next record %+v after %+v", n, rec)
	}

	// A chat turn through ReplyWith.
	s := mustOpenSession(t, svc)
	turn, err := svc.Turn(ctx, parley.Caller{}, s.ID, "two plus two", parley.DefaultParams(), session.ReplyWith(loop))
	if err != nil {
		t.Fatal(err)
	}
	for range turn.Events() {
	}
	stored, err := svc.Conversation(ctx, parley.Caller{}, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(stored.Messages); n != 4 || stored.Messages[2].Role != parley.RoleTool || stored.Messages[3].Content != "reply to two plus two" {
		t.Errorf("chat turn stored %+v", stored.Messages)
	}
}

// TestRespondKeepsListed: what the wire layer asks a response's record to
// keep (ResponseRequest.Listed) reads back with the record, from memory and
// from disk.
func TestRespondKeepsListed(t *testing.T) {
	bolt, err := session.OpenBoltStore(filepath.Join(t.TempDir(), "sessions.db"))
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]session.Store{"memory": session.NewMemoryStore(), "bolt": bolt} {
		t.Run(name, func(t *testing.T) {
			t.Cleanup(func() { st.Close() })
			svc, f := newService(t, st, echo)
			listed := json.RawMessage(`[{"type":"mcp_list_tools","server_label":"math","tools":[{"name":"add"}]}]`)
			resp, err := svc.Respond(context.Background(), parley.Caller{}, session.ResponseRequest{Input: []parley.Message{{Role: parley.RoleUser, Content: "hi"}},
				Params: parley.DefaultParams(), Responder: stepsResponder{f, nil}, Listed: listed})
			if err != nil {
				t.Fatal(err)
			}
			for range resp.Events() {
			}
			got, _, err := svc.GetResponse(context.Background(), parley.Caller{}, resp.Final().ID)
			if err != nil || string(got.Listed) != string(listed) {
				t.Errorf("record %+v, %v", got, err)
			}
		})
	}
}

// progressResponder answers through f, and shows each request's load
// progress (when it has one) a load of model "m" half done; clients are the
// requests' clients.
type progressResponder struct {
	f       *fakeResponder
	clients *[]string
}

func (p progressResponder) Reply(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	if req.LoadProgress != nil {
		req.LoadProgress("m", 0.5)
	}
	*p.clients = append(*p.clients, req.Client)
	return p.f.Reply(ctx, req)
}

func (p progressResponder) Complete(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	return p.f.Complete(ctx, req)
}

// TestTurnOptionsReachTheReply: a turn's options are facts of its reply's
// request, given as arguments: ShowLoadProgress is the request's
// LoadProgress and ReplyWith its responder, on a Turn and on a Regenerate;
// a turn without them has neither. The request names the turn's client.
func TestTurnOptionsReachTheReply(t *testing.T) {
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, f := newService(t, st, echo)
	s := mustOpenSession(t, svc)
	who := parley.Caller{Client: "10.0.0.1"}
	var shown, clients []string
	show := session.ShowLoadProgress(func(model string, frac float64) {
		shown = append(shown, fmt.Sprintf("%s %.1f", model, frac))
	})
	via := session.ReplyWith(progressResponder{f, &clients})
	for i, start := range []func() (*session.Turn, error){
		func() (*session.Turn, error) {
			return svc.Turn(context.Background(), who, s.ID, "hello", parley.DefaultParams(), show, via)
		},
		func() (*session.Turn, error) {
			return svc.Regenerate(context.Background(), who, s.ID, parley.DefaultParams(), via, show)
		},
		func() (*session.Turn, error) {
			return svc.Turn(context.Background(), who, s.ID, "again", parley.DefaultParams(), via)
		},
	} {
		turn, err := start()
		if err != nil {
			t.Fatal(err)
		}
		for range turn.Events() {
		}
		if want := min(i+1, 2); len(shown) != want {
			t.Errorf("turn %d: progress shown %v, want %d times", i+1, shown, want)
		}
	}
	if len(shown) == 2 && (shown[0] != "m 0.5" || shown[1] != "m 0.5") {
		t.Errorf("progress shown %v", shown)
	}
	if len(clients) != 3 || clients[0] != "10.0.0.1" || clients[2] != "10.0.0.1" {
		t.Errorf("the replies' requests name clients %v, want 10.0.0.1 each", clients)
	}
}

// TestTurnCallerReachesTheReply: a turn's reply is asked for as its caller
// (the user and client given to Turn), in the cache scope InCacheScope
// names, and without one in the user's own scope.
func TestTurnCallerReachesTheReply(t *testing.T) {
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, f := newService(t, st, echo)
	ctx, alice := context.Background(), parley.Caller{User: "alice", Client: "10.0.0.1"}
	s, _, err := svc.Open(ctx, alice, "")
	if err != nil {
		t.Fatal(err)
	}
	perClient := parley.ClientCacheScope("alice", "10.0.0.1")
	for _, opts := range [][]session.TurnOption{{session.InCacheScope(perClient)}, nil} {
		turn, err := svc.Turn(ctx, alice, s.ID, "hello", parley.DefaultParams(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		drain(t, turn)
	}
	calls := f.callList()
	if len(calls) != 2 || calls[0].who != alice || calls[1].who != alice {
		t.Fatalf("replies asked for as %+v, want alice from 10.0.0.1 each", calls)
	}
	if calls[0].scope != perClient || calls[1].scope != parley.UserCacheScope("alice") {
		t.Errorf("scopes %q and %q, want the client's then the user's", calls[0].scope, calls[1].scope)
	}
	if _, err := svc.Turn(ctx, parley.Caller{User: "bob", Client: "10.0.0.1"}, s.ID, "mine", parley.DefaultParams()); !isNotFound(err) {
		t.Errorf("bob's turn on alice's session: %v", err)
	}
}
