package session_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// fakeReply is a reply whose events a test plays by hand, with the engine's
// contract: token events, exactly one final event, then the channel closes;
// the final event always fits in the buffer.
type fakeReply struct {
	parley.Reply // the methods the session layer does not call
	ch           chan parley.Event
	prompt       string

	mu   sync.Mutex
	text string
}

func (r *fakeReply) Events() <-chan parley.Event { return r.ch }
func (r *fakeReply) Reasoning() string           { return "" }
func (r *fakeReply) Prompt() string              { return r.prompt }
func (r *fakeReply) Text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.text
}

// token sends one token event; false when ctx ended first.
func (r *fakeReply) token(ctx context.Context, text string) bool {
	select {
	case r.ch <- parley.Event{Token: parley.Token{ID: 1, Text: text}}:
		r.mu.Lock()
		r.text += text
		r.mu.Unlock()
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *fakeReply) finish(reason parley.FinishReason, err error) {
	r.ch <- parley.Event{Done: true, Finish: reason, Err: err, Usage: parley.Usage{CompletionTokens: 7}}
	close(r.ch)
}

// call is one Reply call as the responder saw it.
type call struct {
	key    string
	msgs   []parley.Message
	params parley.Params
	cont   bool // the request's Continue
	// stateless is the request's Stateless: a turn that is never stored.
	stateless bool
	// who and scope are the request's caller and cache scope.
	who   parley.Caller
	scope string
}

// fakeResponder records calls and plays each reply on a goroutine it owns
// through the test's play function; wait blocks until every play returned.
type fakeResponder struct {
	play func(ctx context.Context, c call, r *fakeReply)
	err  error // returned by Reply when set

	mu    sync.Mutex
	calls []call
	wg    sync.WaitGroup
}

func (f *fakeResponder) Reply(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	if f.err != nil {
		return nil, f.err
	}
	msgs := req.Messages
	c := call{key: req.Key, msgs: append([]parley.Message(nil), msgs...), params: req.Params, cont: req.Continue, stateless: req.Stateless,
		who: parley.Caller{User: req.User, Client: req.Client}, scope: req.CacheScope()}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "%s: %s\n", m.Role, m.Content)
	}
	r := &fakeReply{ch: make(chan parley.Event, 1), prompt: b.String()}
	f.wg.Go(func() { f.play(ctx, c, r) })
	return r, nil
}

func (f *fakeResponder) Complete(context.Context, parley.ReplyRequest) (parley.Reply, error) {
	return nil, parley.Errorf(parley.EInvalid, "the session layer completes no raw prompts")
}

func (f *fakeResponder) callList() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// echo plays "reply to <last user message>" as two tokens and ends with eos.
func echo(ctx context.Context, c call, r *fakeReply) {
	last := c.msgs[len(c.msgs)-1].Content
	if !r.token(ctx, "reply to ") || !r.token(ctx, last) {
		r.finish(parley.FinishCancelled, nil)
		return
	}
	r.finish(parley.FinishEOS, nil)
}

func newService(t *testing.T, st session.Store, play func(context.Context, call, *fakeReply), opts ...session.Option) (*session.Service, *fakeResponder) {
	t.Helper()
	f := &fakeResponder{play: play}
	t.Cleanup(f.wg.Wait) // every play goroutine ends before goleak looks
	return session.NewService(st, f, opts...), f
}

func mustOpenSession(t *testing.T, svc *session.Service) *session.Session {
	t.Helper()
	ctx := context.Background()
	s, resumed, err := svc.Open(ctx, parley.Caller{}, "")
	if err != nil || resumed {
		t.Fatalf("Open(\"\") = %v, resumed %v", err, resumed)
	}
	// A new session is stored at its first write; most tests want one that is.
	if err := svc.SetSystem(ctx, parley.Caller{}, s.ID, s.System); err != nil {
		t.Fatal(err)
	}
	stored, _, err := svc.Open(ctx, parley.Caller{}, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	return stored
}

// drain reads a turn to its end and returns its token texts and final event.
func drain(t *testing.T, tr *session.Turn) ([]string, parley.Event) {
	t.Helper()
	var texts []string
	var final parley.Event
	finals := 0
	for ev := range tr.Events() {
		if ev.Done {
			final = ev
			finals++
			continue
		}
		if finals > 0 {
			t.Fatal("token event after the final event")
		}
		texts = append(texts, ev.Token.Text)
	}
	if finals != 1 {
		t.Fatalf("%d final events, want 1", finals)
	}
	return texts, final
}

func TestServiceOpen(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, _ := newService(t, st, echo, session.WithSystemPrompt("Be kind."))
	ctx := context.Background()
	fresh, resumed, err := svc.Open(ctx, parley.Caller{}, "")
	if err != nil || resumed || !session.ValidID(fresh.ID) || fresh.System != "Be kind." || len(fresh.Messages) != 0 {
		t.Fatalf("new session = %+v, %v, %v", fresh, resumed, err)
	}
	// Stored at once, so a reconnect with its id (after a restart, say) resumes it.
	if st.Len() != 1 {
		t.Fatalf("a new session is not stored: Len = %d", st.Len())
	}
	if got, resumed, err := svc.Open(ctx, parley.Caller{}, fresh.ID); err != nil || !resumed || got.ID != fresh.ID || len(got.Messages) != 0 {
		t.Fatalf("resuming a new session: %+v, %v, %v", got, resumed, err)
	}
	s := mustOpenSession(t, svc)
	if st.Len() != 2 || s.Created.IsZero() || s.System != "Be kind." {
		t.Fatalf("after the first write: Len = %d, session %+v", st.Len(), s)
	}
	again, resumed, err := svc.Open(ctx, parley.Caller{}, s.ID)
	if err != nil || !resumed || !reflect.DeepEqual(again, s) {
		t.Fatalf("Open(%s) = %+v, %v, %v; want the stored session, resumed", s.ID, again, resumed, err)
	}
	for _, id := range []string{mustID(t), "nope", "../../x", strings.Repeat("A", 1000)} {
		_, _, err := svc.Open(ctx, parley.Caller{}, id)
		wantCode(t, err, parley.ENotFound)
	}
}

// TestUnusedSessionsAreBounded: sessions stored at creation and never
// written are kept up to a bound; past it the oldest unused ones go, and a
// session with a committed turn stays.
func TestUnusedSessionsAreBounded(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, _ := newService(t, st, echo)
	ctx := context.Background()
	talked := mustOpenSession(t, svc)
	tr, err := svc.Turn(ctx, parley.Caller{}, talked.ID, "hello", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	texts, final := drain(t, tr)
	if final.Err != nil || len(texts) == 0 {
		t.Fatalf("turn: %v", final.Err)
	}
	first, _, err := svc.Open(ctx, parley.Caller{}, "")
	if err != nil {
		t.Fatal(err)
	}
	for range 1100 {
		if _, _, err := svc.Open(ctx, parley.Caller{}, ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.Len(); n > 1024+2 {
		t.Fatalf("store holds %d sessions after 1100 silent connections", n)
	}
	if _, _, err := svc.Open(ctx, parley.Caller{}, first.ID); parley.ErrorCode(err) != parley.ENotFound {
		t.Fatalf("the oldest unused session was kept: %v", err)
	}
	if got, _, err := svc.Open(ctx, parley.Caller{}, talked.ID); err != nil || len(got.Messages) != 2 {
		t.Fatalf("the session with a turn: %+v, %v", got, err)
	}
}

// TestTurnCommitsBeforeFinalEvent proves the order the wire relies on: no
// token event arrives after the turn is stored, and the final event arrives
// only after it is.
func TestTurnCommitsBeforeFinalEvent(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			st := mustOpen(t, k)
			step, quit := make(chan struct{}), make(chan struct{})
			defer close(quit) // a failing test does not leave the play blocked
			play := func(ctx context.Context, c call, r *fakeReply) {
				for _, piece := range []string{"Once", " upon", " a time"} {
					r.token(ctx, piece)
					select {
					case <-step: // the test has checked the store
					case <-quit:
					}
				}
				r.finish(parley.FinishEOS, nil)
			}
			svc, f := newService(t, st, play, session.WithSystemPrompt("sys"))
			s := mustOpenSession(t, svc)
			tr, err := svc.Turn(context.Background(), parley.Caller{}, s.ID, "Tell me a story", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			for ev := range tr.Events() {
				stored := mustGet(t, st, s.ID)
				if !ev.Done {
					// The prompt is stored before the reply, with an empty
					// reply marked interrupted (pending.go); the reply's
					// text comes with the commit (3 tokens: no checkpoint).
					pending := []parley.Message{
						{Role: parley.RoleUser, Content: "Tell me a story"},
						{Role: parley.RoleAssistant, Interrupted: true},
					}
					if !reflect.DeepEqual(stored.Messages, pending) {
						t.Fatalf("while token %q was streaming the store held %v, want %v", ev.Token.Text, stored.Messages, pending)
					}
					step <- struct{}{}
					continue
				}
				want := []parley.Message{
					{Role: parley.RoleUser, Content: "Tell me a story"},
					{Role: parley.RoleAssistant, Content: "Once upon a time"},
				}
				if !reflect.DeepEqual(stored.Messages, want) {
					t.Fatalf("at the final event the store holds %v, want %v", stored.Messages, want)
				}
				if ev.Finish != parley.FinishEOS || ev.Usage.CompletionTokens != 7 {
					t.Fatalf("final event not forwarded as is: %+v", ev)
				}
			}
			if !tr.Committed() || tr.Text() != "Once upon a time" || tr.SessionID() != s.ID {
				t.Fatalf("turn: committed %v text %q id %q", tr.Committed(), tr.Text(), tr.SessionID())
			}
			calls := f.callList()
			wantMsgs := []parley.Message{{Role: parley.RoleSystem, Content: "sys"}, {Role: parley.RoleUser, Content: "Tell me a story"}}
			if len(calls) != 1 || calls[0].key != s.ID || !reflect.DeepEqual(calls[0].msgs, wantMsgs) {
				t.Fatalf("Reply calls = %+v, want key %s and %v", calls, s.ID, wantMsgs)
			}
			if !strings.Contains(tr.Prompt(), "Tell me a story") {
				t.Fatalf("Prompt() = %q", tr.Prompt())
			}
		})
	}
}

func TestTurnCarriesHistoryAndParams(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	defaults := parley.DefaultParams()
	defaults.MaxTokens = 33
	svc, f := newService(t, st, echo, session.WithDefaultParams(defaults))
	ctx := context.Background()
	s := mustOpenSession(t, svc)
	run := func(prompt string, p parley.Params) {
		t.Helper()
		tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, prompt, p)
		if err != nil {
			t.Fatal(err)
		}
		if _, final := drain(t, tr); final.Finish != parley.FinishEOS {
			t.Fatalf("final = %+v", final)
		}
	}
	run("first", parley.Params{})
	own := parley.DefaultParams()
	own.MaxTokens = 5
	run("second", own)
	perSession := parley.DefaultParams()
	perSession.MaxTokens = 9
	perSession.Stop = []string{"\nUser:"}
	if err := svc.SetParams(ctx, parley.Caller{}, s.ID, &perSession); err != nil {
		t.Fatal(err)
	}
	perSession.Stop[0] = "changed after SetParams"
	run("third", parley.Params{})

	calls := f.callList()
	if len(calls) != 3 {
		t.Fatalf("%d calls", len(calls))
	}
	wantThird := turnMsgs("first", "reply to first", "second", "reply to second", "third")
	if !reflect.DeepEqual(calls[2].msgs, wantThird) {
		t.Fatalf("third turn saw %v, want %v", calls[2].msgs, wantThird)
	}
	for i, want := range []int{33, 5, 9} {
		if calls[i].params.MaxTokens != want {
			t.Errorf("turn %d ran with MaxTokens %d, want %d", i+1, calls[i].params.MaxTokens, want)
		}
	}
	if !reflect.DeepEqual(calls[2].params.Stop, []string{"\nUser:"}) {
		t.Errorf("per-session stop = %q", calls[2].params.Stop)
	}
	if got := mustGet(t, st, s.ID); len(got.Messages) != 6 {
		t.Fatalf("stored %d messages, want 6", len(got.Messages))
	}
}

func TestTurnRefusals(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, f := newService(t, st, echo)
	ctx := context.Background()
	s := mustOpenSession(t, svc)
	// Parameters are validated at the edge and at the engine's door, not
	// here: only stored ones (SetParams) are the session's to check.
	bad := parley.DefaultParams()
	bad.Temperature = -1
	tests := []struct {
		name   string
		id     string
		prompt string
		p      parley.Params
		code   string
	}{
		{"malformed id", "x", "hi", parley.Params{}, parley.ENotFound},
		{"empty prompt", s.ID, "", parley.Params{}, parley.EInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := svc.Turn(ctx, parley.Caller{}, tc.id, tc.prompt, tc.p)
			wantCode(t, err, tc.code)
		})
	}
	wantCode(t, svc.SetParams(ctx, parley.Caller{}, s.ID, &bad), parley.EInvalid)
	if len(f.callList()) != 0 {
		t.Fatal("a refused turn reached the responder")
	}

	// An engine refusal (busy) is returned as is, stores nothing, and frees
	// the session for the next turn.
	f.err = parley.Errorf(parley.EBusy, "all slots busy")
	_, err := svc.Turn(ctx, parley.Caller{}, s.ID, "hi", parley.Params{})
	wantCode(t, err, parley.EBusy)
	f.err = nil
	tctx, cancel := context.WithTimeout(ctx, time.Minute) // catches a session left locked
	defer cancel()
	tr, err := svc.Turn(tctx, parley.Caller{}, s.ID, "hi", parley.Params{})
	if err != nil {
		t.Fatalf("turn after a refused one: %v", err)
	}
	drain(t, tr)
	if got := mustGet(t, st, s.ID); len(got.Messages) != 2 {
		t.Fatalf("stored %v, want one turn", got.Messages)
	}
}

func TestTurnCancelledCommitsPartialReply(t *testing.T) {
	tests := []struct {
		name    string
		pieces  []string // sent before the cancel
		want    []parley.Message
		commits bool
	}{
		{"partial text is kept, marked interrupted", []string{"Hel", "lo"}, []parley.Message{
			{Role: parley.RoleUser, Content: "hi"}, {Role: parley.RoleAssistant, Content: "Hello", Interrupted: true}}, true},
		{"no text keeps the prompt, its reply empty and interrupted", nil, []parley.Message{
			{Role: parley.RoleUser, Content: "hi"}, {Role: parley.RoleAssistant, Interrupted: true}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := mustOpen(t, storeKinds()[1]) // durable: the commit outlives the cancelled context
			sent := make(chan struct{})
			play := func(ctx context.Context, c call, r *fakeReply) {
				for _, p := range tc.pieces {
					r.token(ctx, p)
				}
				close(sent)
				<-ctx.Done() // the engine stops within one step of the cancel
				r.finish(parley.FinishCancelled, nil)
			}
			svc, _ := newService(t, st, play)
			s := mustOpenSession(t, svc)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, "hi", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			<-sent
			cancel()
			_, final := drain(t, tr)
			if final.Finish != parley.FinishCancelled {
				t.Fatalf("final = %+v, want cancelled", final)
			}
			if tr.Committed() != tc.commits {
				t.Fatalf("Committed = %v, want %v", tr.Committed(), tc.commits)
			}
			got := mustGet(t, st, s.ID)
			if len(got.Messages) != len(tc.want) || (tc.want != nil && !reflect.DeepEqual(got.Messages, tc.want)) {
				t.Fatalf("stored %v, want %v", got.Messages, tc.want)
			}
		})
	}
}

func TestTurnErrorCommitsNothing(t *testing.T) {
	engineErr := parley.Errorf(parley.EInternal, "decode failed")
	tests := []struct {
		name string
		play func(ctx context.Context, c call, r *fakeReply)
	}{
		{"error finish", func(ctx context.Context, c call, r *fakeReply) {
			r.token(ctx, "half a rep")
			r.finish(parley.FinishError, engineErr)
		}},
		{"no final event", func(ctx context.Context, c call, r *fakeReply) {
			r.token(ctx, "half a rep")
			close(r.ch)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := mustOpen(t, storeKinds()[0])
			svc, _ := newService(t, st, tc.play)
			s := mustOpenSession(t, svc)
			before := mustGet(t, st, s.ID)
			tr, err := svc.Turn(context.Background(), parley.Caller{}, s.ID, "hi", parley.Params{})
			if err != nil {
				t.Fatal(err)
			}
			texts, final := drain(t, tr)
			if final.Finish != parley.FinishError || final.Err == nil {
				t.Fatalf("final = %+v, want an error", final)
			}
			if len(texts) != 1 || texts[0] != "half a rep" {
				t.Fatalf("tokens before the error not forwarded: %q", texts)
			}
			if tr.Committed() {
				t.Fatal("an errored turn was committed")
			}
			// The pending write and its undo leave a new version (Updated)
			// of the same session.
			after := mustGet(t, st, s.ID)
			after.Updated = before.Updated
			if !reflect.DeepEqual(after, before) {
				t.Fatalf("an errored turn changed the session: %+v -> %+v", before, after)
			}
		})
	}
}

func TestTurnCommitFailureIsAnError(t *testing.T) {
	st := session.NewMemoryStore()
	release := make(chan struct{})
	closeRelease := sync.OnceFunc(func() { close(release) })
	defer closeRelease() // a failing test does not leave the play blocked
	play := func(ctx context.Context, c call, r *fakeReply) {
		r.token(ctx, "text")
		<-release
		r.finish(parley.FinishEOS, nil)
	}
	svc, _ := newService(t, st, play)
	s := mustOpenSession(t, svc)
	tr, err := svc.Turn(context.Background(), parley.Caller{}, s.ID, "hi", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil { // the store goes away mid-reply
		t.Fatal(err)
	}
	closeRelease()
	_, final := drain(t, tr)
	if final.Finish != parley.FinishError || parley.ErrorCode(final.Err) != parley.EUnavailable {
		t.Fatalf("final = %+v, want an error with code unavailable", final)
	}
	if tr.Committed() {
		t.Fatal("Committed despite the failed Put")
	}
}

// TestTurnAbandoned: a reader that cancels and stops reading blocks nothing;
// the turn's goroutine ends (goleak checks), the partial reply is stored,
// and the session is free for the next turn.
func TestTurnAbandoned(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	var once atomic.Bool
	play := func(ctx context.Context, c call, r *fakeReply) {
		if once.Swap(true) {
			echo(ctx, c, r)
			return
		}
		for i := 0; i < 1000 && r.token(ctx, "x"); i++ {
		}
		r.finish(parley.FinishCancelled, nil)
	}
	svc, _ := newService(t, st, play)
	s := mustOpenSession(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, "hi", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	<-tr.Events() // read one token, then walk away
	cancel()

	next, cancelNext := context.WithTimeout(context.Background(), time.Minute) // catches a session left locked
	defer cancelNext()
	tr2, err := svc.Turn(next, parley.Caller{}, s.ID, "again", parley.Params{})
	if err != nil {
		t.Fatalf("the session stayed locked after an abandoned turn: %v", err)
	}
	drain(t, tr2)
	got := mustGet(t, st, s.ID)
	if len(got.Messages) != 4 || got.Messages[0].Content != "hi" || !strings.HasPrefix(got.Messages[1].Content, "x") {
		t.Fatalf("stored %v, want the partial turn and the next one", got.Messages)
	}
}

// TestTurnsQueuePerSession starts several turns on one session at once: they
// run one at a time, each sees the turns before it committed, and none
// interleave; meanwhile another session is not held up.
func TestTurnsQueuePerSession(t *testing.T) {
	const turns = 5
	st := mustOpen(t, storeKinds()[1])
	var active, maxActive atomic.Int32
	play := func(ctx context.Context, c call, r *fakeReply) {
		n := active.Add(1)
		for {
			m := maxActive.Load()
			if n <= m || maxActive.CompareAndSwap(m, n) {
				break
			}
		}
		last := c.msgs[len(c.msgs)-1].Content
		r.token(ctx, "reply to ")
		time.Sleep(2 * time.Millisecond) // give a wrongly admitted second turn time to show up
		r.token(ctx, last)
		active.Add(-1)
		r.finish(parley.FinishEOS, nil)
	}
	svc, f := newService(t, st, play)
	s := mustOpenSession(t, svc)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, turns)
	for i := range turns {
		wg.Go(func() {
			tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, fmt.Sprintf("prompt %d", i), parley.Params{})
			if err != nil {
				errs <- err
				return
			}
			var text strings.Builder
			for ev := range tr.Events() {
				text.WriteString(ev.Token.Text)
			}
			if want := fmt.Sprintf("reply to prompt %d", i); text.String() != want {
				errs <- fmt.Errorf("turn %d streamed %q, want %q", i, text.String(), want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if maxActive.Load() != 1 {
		t.Fatalf("%d replies of one session ran at once", maxActive.Load())
	}
	calls := f.callList()
	if len(calls) != turns {
		t.Fatalf("%d calls, want %d", len(calls), turns)
	}
	for i, c := range calls {
		if len(c.msgs) != 2*i+1 {
			t.Fatalf("call %d saw %d messages, want %d: a turn started before the one before it was stored", i, len(c.msgs), 2*i+1)
		}
	}
	got := mustGet(t, st, s.ID)
	if len(got.Messages) != 2*turns {
		t.Fatalf("stored %d messages, want %d", len(got.Messages), 2*turns)
	}
	for i := 0; i < len(got.Messages); i += 2 {
		u, a := got.Messages[i], got.Messages[i+1]
		if u.Role != parley.RoleUser || a.Role != parley.RoleAssistant || a.Content != "reply to "+u.Content {
			t.Fatalf("interleaved history at %d: %v", i, got.Messages)
		}
	}
}

func TestTurnWaitHonoursContextAndSessionsAreIndependent(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	release := make(chan struct{})
	closeRelease := sync.OnceFunc(func() { close(release) })
	defer closeRelease() // a failing test does not leave the play blocked
	play := func(ctx context.Context, c call, r *fakeReply) {
		if c.msgs[len(c.msgs)-1].Content == "hold" {
			<-release
		}
		echo(ctx, c, r)
	}
	svc, _ := newService(t, st, play)
	a, b := mustOpenSession(t, svc), mustOpenSession(t, svc)
	ctx := context.Background()
	held, err := svc.Turn(ctx, parley.Caller{}, a.ID, "hold", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}

	// A second turn on a waits, and gives up with its context.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := svc.Turn(wctx, parley.Caller{}, a.ID, "queued", parley.Params{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued turn: err = %v, want the context's deadline", err)
	}
	// So do edits of a.
	if err := svc.Reset(wctx, parley.Caller{}, a.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("reset during a turn: err = %v, want the context's deadline", err)
	}
	// Session b is not held up by a.
	bctx, cancelB := context.WithTimeout(ctx, time.Minute) // a is held until release: waiting for it would hit this
	defer cancelB()
	tb, err := svc.Turn(bctx, parley.Caller{}, b.ID, "other", parley.Params{})
	if err != nil {
		t.Fatalf("another session waited for a: %v", err)
	}
	drain(t, tb)

	closeRelease()
	drain(t, held)
	if got := mustGet(t, st, a.ID); len(got.Messages) != 2 {
		t.Fatalf("a holds %v, want only the held turn", got.Messages)
	}
}

func TestResetAndSetSystem(t *testing.T) {
	st := mustOpen(t, storeKinds()[1])
	svc, f := newService(t, st, echo, session.WithSystemPrompt("first system"))
	ctx := context.Background()
	s := mustOpenSession(t, svc)
	turn := func(prompt string) {
		t.Helper()
		tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, prompt, parley.Params{})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, tr)
	}
	turn("one")
	if err := svc.SetSystem(ctx, parley.Caller{}, s.ID, "second system"); err != nil {
		t.Fatal(err)
	}
	turn("two")
	if err := svc.Reset(ctx, parley.Caller{}, s.ID); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, st, s.ID)
	if len(got.Messages) != 0 || got.System != "second system" {
		t.Fatalf("after Reset: %+v", got)
	}
	if err := svc.SetSystem(ctx, parley.Caller{}, s.ID, ""); err != nil {
		t.Fatal(err)
	}
	turn("three")

	calls := f.callList()
	wants := [][]parley.Message{
		{{Role: parley.RoleSystem, Content: "first system"}, {Role: parley.RoleUser, Content: "one"}},
		append([]parley.Message{{Role: parley.RoleSystem, Content: "second system"}}, turnMsgs("one", "reply to one", "two")...),
		turnMsgs("three"),
	}
	for i, want := range wants {
		if !reflect.DeepEqual(calls[i].msgs, want) {
			t.Errorf("call %d saw %v, want %v", i, calls[i].msgs, want)
		}
	}
	wantCode(t, svc.Reset(ctx, parley.Caller{}, "bad"), parley.ENotFound)
	wantCode(t, svc.SetSystem(ctx, parley.Caller{}, "bad", "x"), parley.ENotFound)
}

// A session nobody has written to is stored by its first committed turn,
// with the default system prompt, and can be resumed from then on.
func TestFirstTurnStoresANewSession(t *testing.T) {
	st := mustOpen(t, storeKinds()[0])
	svc, _ := newService(t, st, echo, session.WithSystemPrompt("Be kind."))
	ctx := context.Background()
	s, _, err := svc.Open(ctx, parley.Caller{}, "")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := svc.Turn(ctx, parley.Caller{}, s.ID, "hello", parley.Params{})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, tr)
	got := mustGet(t, st, s.ID)
	if got.System != "Be kind." || len(got.Messages) != 2 || got.Messages[0].Content != "hello" {
		t.Fatalf("stored %+v, want the system prompt and the first turn", got)
	}
	if _, resumed, err := svc.Open(ctx, parley.Caller{}, s.ID); err != nil || !resumed {
		t.Fatalf("resume after the first turn: %v, %v", resumed, err)
	}
}

// TestNewSessionResumesAfterRestart: a session id handed out on connect is
// resumable after the store is closed and opened again (a server restart),
// before any turn was committed.
func TestNewSessionResumesAfterRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	st := openBolt(t, path)
	svc, _ := newService(t, st, echo)
	ctx := context.Background()
	fresh, _, err := svc.Open(ctx, parley.Caller{}, "")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openBolt(t, path)
	defer st.Close()
	svc, _ = newService(t, st, echo)
	got, resumed, err := svc.Open(ctx, parley.Caller{}, fresh.ID)
	if err != nil || !resumed || got.ID != fresh.ID {
		t.Fatalf("after a restart: %+v, %v, %v", got, resumed, err)
	}
}
