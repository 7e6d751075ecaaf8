package session_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// TestDurableTurnIsStoredBeforeItsReply: a durable response is in the store,
// marked interrupted, while its reply runs (what a restart after a crash
// finds), and its commit replaces that with the reply, stored once, on
// every store (Redis's optimistic versions included).
func TestDurableTurnIsStoredBeforeItsReply(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k)
			release := make(chan struct{})
			play := func(ctx context.Context, c call, r *fakeReply) {
				r.token(ctx, "Hel")
				<-release
				r.token(ctx, "lo")
				r.finish(parley.FinishEOS, nil)
			}
			svc, _ := newService(t, st, play)
			resp, err := svc.Respond(context.Background(), parley.Caller{}, session.ResponseRequest{
				Input: []parley.Message{{Role: parley.RoleUser, Content: "hi"}}, Params: parley.DefaultParams(), Durable: true})
			if err != nil {
				t.Fatal(err)
			}
			pending := mustGet(t, st, resp.SessionID())
			rec, ok := pending.Record(resp.Record.ID)
			if len(pending.Messages) != 2 || !pending.Messages[1].Interrupted || !ok ||
				rec.Status != session.StatusIncomplete || rec.Finish != session.FinishInterrupted {
				t.Fatalf("while the reply runs the store holds %+v, record %+v (%v)", pending.Messages, rec, ok)
			}
			close(release)
			_, final := drain(t, resp.Turn)
			if final.Finish != parley.FinishEOS {
				t.Fatalf("final %+v", final)
			}
			got := mustGet(t, st, resp.SessionID())
			rec, ok = got.Record(resp.Record.ID)
			if len(got.Messages) != 2 || got.Messages[1].Content != "Hello" || got.Messages[1].Interrupted ||
				!ok || rec.Status != session.StatusCompleted || len(got.Responses) != 1 {
				t.Fatalf("after the reply the store holds %+v, records %+v", got.Messages, got.Responses)
			}
		})
	}
}

// TestChatTurnCheckpointsItsReply: a chat turn's prompt is stored before
// its reply, with an empty reply marked interrupted, and the reply's text so
// far replaces that at checkpoints (16 tokens, then 32), each written before
// the token that completes it reaches the reader; the commit stores the
// whole reply, not marked. On every store. A snapshot taken while the reply
// runs shows neither the pending prompt nor the reply.
func TestChatTurnCheckpointsItsReply(t *testing.T) {
	const tokens = 40
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k)
			step, quit := make(chan struct{}), make(chan struct{})
			defer close(quit)
			play := func(ctx context.Context, c call, r *fakeReply) {
				for range tokens {
					r.token(ctx, "a")
					select {
					case <-step:
					case <-quit:
					}
				}
				r.finish(parley.FinishEOS, nil)
			}
			svc, _ := newService(t, st, play)
			s := mustOpenSession(t, svc)
			tr, err := svc.Turn(context.Background(), parley.Caller{}, s.ID, "Tell me a story", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for ev := range tr.Events() {
				got := mustGet(t, st, s.ID)
				if ev.Done {
					if len(got.Messages) != 2 || got.Messages[1].Content != strings.Repeat("a", tokens) || got.Messages[1].Interrupted {
						t.Fatalf("after the reply the store holds %+v", got.Messages)
					}
					break
				}
				seen++
				checkpoint := 0
				switch {
				case seen >= 32:
					checkpoint = 32
				case seen >= 16:
					checkpoint = 16
				}
				want := []parley.Message{{Role: parley.RoleUser, Content: "Tell me a story"},
					{Role: parley.RoleAssistant, Content: strings.Repeat("a", checkpoint), Interrupted: true}}
				if !reflect.DeepEqual(got.Messages, want) {
					t.Fatalf("with %d tokens read the store holds %+v, want %+v", seen, got.Messages, want)
				}
				if seen == 20 {
					snap, pending, err := svc.Snapshot(context.Background(), parley.Caller{}, tr)
					if err != nil || !pending || len(snap.Messages) != 0 {
						t.Fatalf("snapshot while the reply runs: %+v pending %v, %v", snap, pending, err)
					}
				}
				step <- struct{}{}
			}
		})
	}
}

// TestContinueCarriesOnTheLastReply: Continue asks the responder to carry
// on the last reply (the conversation ends with it, the request says so),
// and stores the reply whole, its text then the new, in place of the old:
// one prompt, one reply. A conversation without a reply cannot continue.
func TestContinueCarriesOnTheLastReply(t *testing.T) {
	for _, k := range storeKinds()[:2] {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k)
			var continued []bool
			play := func(ctx context.Context, c call, r *fakeReply) {
				continued = append(continued, c.cont)
				if c.cont {
					r.token(ctx, " and then")
				} else {
					r.token(ctx, "Once upon")
				}
				r.finish(parley.FinishLength, nil)
			}
			svc, f := newService(t, st, play)
			ctx := context.Background()
			s := mustOpenSession(t, svc)
			if _, err := svc.Continue(ctx, parley.Caller{}, s.ID, parley.Params{}); parley.ErrorCode(err) != parley.EInvalid {
				t.Fatalf("continue with no reply: %v, want invalid", err)
			}
			tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, "Tell me", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, tr)
			tr, err = svc.Continue(ctx, parley.Caller{}, s.ID, parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			texts, final := drain(t, tr)
			if final.Finish != parley.FinishLength || strings.Join(texts, "") != " and then" || tr.Text() != "Once upon and then" {
				t.Fatalf("continue streamed %q, final %+v, text %q", texts, final, tr.Text())
			}
			calls := f.callList()
			last := calls[len(calls)-1].msgs
			if len(last) != 2 || last[1].Role != parley.RoleAssistant || last[1].Content != "Once upon" || !continued[1] || continued[0] {
				t.Fatalf("the continue asked for %+v (continued %v)", last, continued)
			}
			got := mustGet(t, st, s.ID)
			want := []parley.Message{{Role: parley.RoleUser, Content: "Tell me"}, {Role: parley.RoleAssistant, Content: "Once upon and then"}}
			if !reflect.DeepEqual(got.Messages, want) {
				t.Fatalf("after continue the store holds %+v, want %+v", got.Messages, want)
			}
		})
	}
}
