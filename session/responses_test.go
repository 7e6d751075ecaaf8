package session_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

func respond(t *testing.T, svc *session.Service, req session.ResponseRequest) session.ResponseRecord {
	t.Helper()
	if req.Params.MaxTokens == 0 {
		req.Params = parley.DefaultParams()
	}
	r, err := svc.Respond(context.Background(), parley.Caller{}, req)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, r.Turn)
	return r.Final()
}

func user(text string) []parley.Message {
	return []parley.Message{{Role: parley.RoleUser, Content: text}}
}

// TestRespondStatelessReply: an unstored turn (store: false, or one chained
// on a connection's local session) asks for a stateless reply, so the
// engine keeps no copy of its KV state past its slot; a stored turn, and a
// session turn, do not.
func TestRespondStatelessReply(t *testing.T) {
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, f := newService(t, st, echo)
	stored := respond(t, svc, session.ResponseRequest{Input: user("kept")})
	r, err := svc.Respond(context.Background(), parley.Caller{}, session.ResponseRequest{Previous: stored.ID, Input: user("not kept"), NoStore: true, Params: parley.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, r.Turn)
	respond(t, svc, session.ResponseRequest{Previous: r.Final().ID, Local: r.Local(), Input: user("chained")})
	sess := mustOpenSession(t, svc)
	turn, err := svc.Turn(context.Background(), parley.Caller{}, sess.ID, "a session turn", parley.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	drain(t, turn)
	var got []bool
	for _, c := range f.callList() {
		got = append(got, c.stateless)
	}
	if want := []bool{false, true, true, false}; !slices.Equal(got, want) {
		t.Fatalf("stateless replies %v, want %v", got, want)
	}
}

// TestRespondRecordsSurviveTrimming: records point at absolute positions,
// so the byte cap dropping old turns neither breaks newer records nor lets
// a dropped one show other messages.
func TestRespondRecordsSurviveTrimming(t *testing.T) {
	st := session.NewMemoryStore(session.WithMaxBytes(200))
	t.Cleanup(func() { st.Close() })
	svc, _ := newService(t, st, echo)
	ctx := context.Background()
	first := respond(t, svc, session.ResponseRequest{Input: user(strings.Repeat("a", 40))})
	var last session.ResponseRecord = first
	for i := range 4 {
		last = respond(t, svc, session.ResponseRequest{Previous: last.ID, Input: user(strings.Repeat("b", 10+i))})
	}
	_, sess, err := svc.GetResponse(ctx, parley.Caller{}, last.ID)
	if err != nil {
		t.Fatalf("response id %q names no session: %v", last.ID, err)
	}
	if sess.Trimmed == 0 {
		t.Fatalf("nothing trimmed: %d bytes", sess.Bytes())
	}
	if _, _, err := svc.GetResponse(ctx, parley.Caller{}, first.ID); parley.ErrorCode(err) != parley.ENotFound {
		t.Fatalf("a trimmed response: %v", err)
	}
	rec, got, err := svc.GetResponse(ctx, parley.Caller{}, last.ID)
	if err != nil {
		t.Fatal(err)
	}
	if span := got.Span(rec.Start, rec.End); len(span) != 2 || span[1].Content != "reply to "+strings.Repeat("b", 13) {
		t.Fatalf("span %+v", span)
	}
}

// TestSessionJSONBackwardCompatible: sessions stored before the Responses
// API decode unchanged, and a session without its state encodes in the original format.
func TestSessionJSONBackwardCompatible(t *testing.T) {
	old := `{"id":"AAAAAAAAAAAAAAAAAAAAAA","system":"s","messages":[{"role":"user","content":"hi"}],"created":"2026-01-01T00:00:00Z","updated":"2026-01-01T00:00:00Z"}`
	var s session.Session
	if err := json.Unmarshal([]byte(old), &s); err != nil || s.Trimmed != 0 || s.Responses != nil || s.Metadata != nil {
		t.Fatalf("decode %+v, %v", s, err)
	}
	b, err := json.Marshal(&s)
	if err != nil || string(b) != old {
		t.Fatalf("re-encoded %s, want %s (%v)", b, old, err)
	}
}

func TestRespondRefusals(t *testing.T) {
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, _ := newService(t, st, echo)
	ctx := context.Background()
	p := parley.DefaultParams()
	for name, req := range map[string]session.ResponseRequest{
		"no input":         {Params: p},
		"ends with reply":  {Params: p, Input: []parley.Message{{Role: parley.RoleAssistant, Content: "x"}}},
		"unknown previous": {Params: p, Input: user("x"), Previous: "resp_AAAAAAAAAAAAAAAAAAAAAA000000000000"},
		"bad previous":     {Params: p, Input: user("x"), Previous: "resp_x"},
		"unknown conv":     {Params: p, Input: user("x"), Conversation: "conv_AAAAAAAAAAAAAAAAAAAAAA"},
		"both":             {Params: p, Input: user("x"), Previous: "resp_x", Conversation: "conv_x"},
	} {
		if _, err := svc.Respond(ctx, parley.Caller{}, req); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if st.Len() != 0 {
		t.Fatalf("refusals stored %d sessions", st.Len())
	}
}
