package session_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// bigImage is an image part of n bytes (its content depends on seed); the session layer never decodes it.
func bigImage(n int, seed byte) parley.ImagePart {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	h := sha256.Sum256(b)
	return parley.ImagePart{SHA256: hex.EncodeToString(h[:]), MediaType: "image/png", Data: b}
}

// A turn whose image is larger than the per-session cap of text (DefaultMaxBytes) keeps the conversation's earlier
// turns, on the chat's turns and on the Responses API alike: images count against a budget of their own, and the
// response before it still continues.
func TestImageLargerThanTheTextCapKeepsTheConversation(t *testing.T) {
	ctx := context.Background()
	big := bigImage(session.DefaultMaxBytes+(512<<10), 1)

	t.Run("chat", func(t *testing.T) {
		st := session.NewMemoryStore()
		t.Cleanup(func() { st.Close() })
		svc, _ := newService(t, st, echo)
		s := mustOpenSession(t, svc)
		for _, p := range []string{"first", "second"} {
			tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, p, parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			drain(t, tr)
		}
		tr, err := svc.ImageTurn(ctx, parley.Caller{}, s.ID, "look", []parley.ImagePart{big}, parley.Params{})
		if err != nil {
			t.Fatal(err)
		}
		if _, final := drain(t, tr); final.Finish == parley.FinishError || !tr.Committed() {
			t.Fatalf("the image turn: %+v, committed %v", final, tr.Committed())
		}
		got := mustGet(t, st, s.ID)
		if len(got.Messages) != 6 || got.Trimmed != 0 || got.Messages[0].Content != "first" ||
			len(got.Messages[4].Images) != 1 || len(got.Messages[4].Images[0].Data) != len(big.Data) {
			t.Fatalf("stored after the image turn: %d messages, %d trimmed", len(got.Messages), got.Trimmed)
		}
	})

	t.Run("responses", func(t *testing.T) {
		st := session.NewMemoryStore()
		t.Cleanup(func() { st.Close() })
		svc, _ := newService(t, st, echo)
		first := respond(t, svc, session.ResponseRequest{Input: user("first")})
		withImage := []parley.Message{{Role: parley.RoleUser, Content: "look", Images: []parley.ImagePart{big}}}
		second := respond(t, svc, session.ResponseRequest{Previous: first.ID, Input: withImage})
		for _, id := range []string{first.ID, second.ID} {
			if _, _, err := svc.GetResponse(ctx, parley.Caller{}, id); err != nil {
				t.Fatalf("response %s after the image turn: %v", id, err)
			}
		}
		third := respond(t, svc, session.ResponseRequest{Previous: second.ID, Input: user("and then?")})
		_, sess, err := svc.GetResponse(ctx, parley.Caller{}, third.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(sess.Messages) != 6 || sess.Trimmed != 0 || sess.Messages[0].Content != "first" {
			t.Fatalf("after the next turn: %d messages, %d trimmed", len(sess.Messages), sess.Trimmed)
		}
	})
}

// A prompt whose images would take the conversation past its image budget is refused before anything runs or is
// written, with a too_large error naming the limit and its flag: the conversation is unchanged and no reply was
// asked for. An image the conversation already holds costs nothing again.
func TestImageBudgetRefusesUpFront(t *testing.T) {
	ctx := context.Background()
	const budget = 3 << 20
	a, b := bigImage(2<<20, 1), bigImage(2<<20, 2)

	t.Run("chat", func(t *testing.T) {
		st := session.NewMemoryStore()
		t.Cleanup(func() { st.Close() })
		svc, f := newService(t, st, echo, session.WithMaxConversationImageBytes(budget))
		s := mustOpenSession(t, svc)
		tr, err := svc.ImageTurn(ctx, parley.Caller{}, s.ID, "one", []parley.ImagePart{a}, parley.Params{})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, tr)
		before := mustGet(t, st, s.ID)
		calls := len(f.callList())
		_, err = svc.ImageTurn(ctx, parley.Caller{}, s.ID, "two", []parley.ImagePart{b}, parley.Params{})
		wantCode(t, err, parley.ETooLarge)
		if msg := parley.ErrorMessage(err); !strings.Contains(msg, "--image-max-bytes-per-conversation") || !strings.Contains(msg, "3.0 MiB") {
			t.Errorf("the refusal says %q", msg)
		}
		if n := len(f.callList()); n != calls {
			t.Errorf("a refused turn asked for a reply: %d calls, want %d", n, calls)
		}
		if after := mustGet(t, st, s.ID); len(after.Messages) != len(before.Messages) || !after.Updated.Equal(before.Updated) {
			t.Errorf("a refused turn changed the conversation: %d messages (was %d), updated %v (was %v)",
				len(after.Messages), len(before.Messages), after.Updated, before.Updated)
		}
		// The same image again is taken: the conversation keeps one copy.
		tr, err = svc.ImageTurn(ctx, parley.Caller{}, s.ID, "again", []parley.ImagePart{a}, parley.Params{})
		if err != nil {
			t.Fatalf("the image the conversation holds: %v", err)
		}
		drain(t, tr)
		if got := mustGet(t, st, s.ID); len(got.Messages) != 4 {
			t.Errorf("%d messages after the repeated image, want 4", len(got.Messages))
		}
		// With the budget lowered below what a conversation holds, what brings no new image still runs: its image
		// prompt regenerated, a text prompt.
		s2 := mustOpenSession(t, svc)
		tr, err = svc.ImageTurn(ctx, parley.Caller{}, s2.ID, "one", []parley.ImagePart{a}, parley.Params{})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, tr)
		lower, _ := newService(t, st, echo, session.WithMaxConversationImageBytes(1<<20))
		tr, err = lower.Regenerate(ctx, parley.Caller{}, s2.ID, parley.Params{})
		if err != nil {
			t.Fatalf("regenerate under a lowered budget: %v", err)
		}
		drain(t, tr)
		tr, err = lower.Turn(ctx, parley.Caller{}, s2.ID, "text", parley.Params{})
		if err != nil {
			t.Fatalf("a text prompt under a lowered budget: %v", err)
		}
		drain(t, tr)
		if got := mustGet(t, st, s2.ID); len(got.Messages) != 4 || len(got.Messages[0].Images) != 1 || len(got.Messages[0].Images[0].Data) != len(a.Data) {
			t.Errorf("%d messages after the regenerate and a text prompt, want 4 with the image first", len(got.Messages))
		}
	})

	t.Run("responses", func(t *testing.T) {
		st := session.NewMemoryStore()
		t.Cleanup(func() { st.Close() })
		svc, f := newService(t, st, echo, session.WithMaxConversationImageBytes(budget))
		first := respond(t, svc, session.ResponseRequest{Input: []parley.Message{{Role: parley.RoleUser, Content: "one", Images: []parley.ImagePart{a}}}})
		_, before, err := svc.GetResponse(ctx, parley.Caller{}, first.ID)
		if err != nil {
			t.Fatal(err)
		}
		calls := len(f.callList())
		// The new image in an earlier input item counts as one in the prompt does.
		_, err = svc.Respond(ctx, parley.Caller{}, session.ResponseRequest{Previous: first.ID, Params: parley.DefaultParams(), Input: []parley.Message{
			{Role: parley.RoleUser, Content: "two", Images: []parley.ImagePart{b}}, {Role: parley.RoleAssistant, Content: "ok"}, {Role: parley.RoleUser, Content: "so?"}}})
		wantCode(t, err, parley.ETooLarge)
		if n := len(f.callList()); n != calls {
			t.Errorf("a refused response asked for a reply: %d calls, want %d", n, calls)
		}
		_, after, err := svc.GetResponse(ctx, parley.Caller{}, first.ID)
		if err != nil || len(after.Messages) != len(before.Messages) || !after.Updated.Equal(before.Updated) {
			t.Fatalf("a refused response changed the conversation: %v, %d messages (was %d)", err, len(after.Messages), len(before.Messages))
		}
		// A new conversation whose one request brings more than the budget is refused too.
		_, err = svc.Respond(ctx, parley.Caller{}, session.ResponseRequest{Params: parley.DefaultParams(), Input: []parley.Message{
			{Role: parley.RoleUser, Content: "both", Images: []parley.ImagePart{a, b}}}})
		wantCode(t, err, parley.ETooLarge)
		// Not stored, it is not held to the budget.
		r, err := svc.Respond(ctx, parley.Caller{}, session.ResponseRequest{NoStore: true, Params: parley.DefaultParams(), Input: []parley.Message{
			{Role: parley.RoleUser, Content: "both", Images: []parley.ImagePart{a, b}}}})
		if err != nil {
			t.Fatalf("an unstored response: %v", err)
		}
		drain(t, r.Turn)
	})
}

// The per-session cap of text drops the oldest turns to fit, but never the newest one: a turn larger than the cap
// alone is kept whole, and the turns before it go.
func TestTextCapKeepsTheNewestTurn(t *testing.T) {
	st := session.NewMemoryStore(session.WithMaxBytes(100))
	t.Cleanup(func() { st.Close() })
	s := &session.Session{ID: mustID(t), Messages: turnMsgs("old", "reply", strings.Repeat("x", 200), "reply")}
	mustPut(t, st, s)
	got := mustGet(t, st, s.ID)
	if len(got.Messages) != 2 || got.Trimmed != 2 || got.Messages[0].Content != strings.Repeat("x", 200) {
		t.Fatalf("stored %d messages, %d trimmed", len(got.Messages), got.Trimmed)
	}
}

// The Responses API holds a stored conversation to its number of images as the chat's turns are.
func TestRespondImageCount(t *testing.T) {
	st := session.NewMemoryStore()
	t.Cleanup(func() { st.Close() })
	svc, _ := newService(t, st, echo, session.WithMaxConversationImages(1))
	first := respond(t, svc, session.ResponseRequest{Input: []parley.Message{{Role: parley.RoleUser, Content: "one", Images: []parley.ImagePart{bigImage(100, 1)}}}})
	_, err := svc.Respond(context.Background(), parley.Caller{}, session.ResponseRequest{Previous: first.ID, Params: parley.DefaultParams(),
		Input: []parley.Message{{Role: parley.RoleUser, Content: "two", Images: []parley.ImagePart{bigImage(100, 2)}}}})
	wantCode(t, err, parley.ETooLarge)
	if msg := parley.ErrorMessage(err); !strings.Contains(msg, "--image-max-per-conversation") {
		t.Errorf("the refusal says %q", msg)
	}
}

// A Responses request whose input items and prompt together pass the cap of text keeps them all, and its record:
// the turns before it go, the response continues.
func TestRespondInputItemsPastTheTextCap(t *testing.T) {
	st := session.NewMemoryStore(session.WithMaxBytes(300))
	t.Cleanup(func() { st.Close() })
	svc, _ := newService(t, st, echo)
	first := respond(t, svc, session.ResponseRequest{Input: user("first")})
	items := []parley.Message{{Role: parley.RoleUser, Content: strings.Repeat("a", 200)}, {Role: parley.RoleAssistant, Content: strings.Repeat("b", 200)},
		{Role: parley.RoleUser, Content: "so?"}}
	second := respond(t, svc, session.ResponseRequest{Previous: first.ID, Input: items})
	rec, sess, err := svc.GetResponse(context.Background(), parley.Caller{}, second.ID)
	if err != nil {
		t.Fatalf("the response whose input passed the cap: %v", err)
	}
	if span := sess.Span(rec.Start, rec.End); len(span) != 4 || span[0].Content != items[0].Content || sess.Trimmed != 2 {
		t.Fatalf("its messages: %+v, %d trimmed", span, sess.Trimmed)
	}
	respond(t, svc, session.ResponseRequest{Previous: second.ID, Input: user("and then?")})
}
