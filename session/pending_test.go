package session_test

import (
	"context"
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
			resp, err := svc.Respond(context.Background(), session.ResponseRequest{
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
