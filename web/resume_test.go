package web_test

// A reply survives its socket: a resumed session shows every accepted
// turn (never a stale history), and a client that comes back within the
// resume grace picks the reply back up, in JSON mode and in text mode.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/web"
)

// pacedGenerator is the engine as a slower model: gap between its token
// events, so that a reply outlasts a reconnect. The engine decodes ahead of
// the pacing; what it decoded past a cancellation the pacing has not
// released is dropped, and the reply ends cancelled after the tokens it
// released, as a slow model's would one step after its cancellation.
//
// With a gate, the reply also stops after hold released tokens until the
// gate is closed: a test that must resume while the reply is still in
// flight holds it there, instead of hoping that the resume comes before
// the paced reply ends.
type pacedGenerator struct {
	*llm.Engine
	gap  time.Duration
	hold int
	gate chan struct{}
}

func (g *pacedGenerator) Generate(ctx context.Context, req parley.GenerateRequest) (<-chan parley.Event, error) {
	in, err := g.Engine.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make(chan parley.Event, 1)
	go func() {
		defer close(out)
		released := 0
		for ev := range in {
			if g.gate != nil && released == g.hold && ctx.Err() == nil {
				select {
				case <-g.gate:
				case <-ctx.Done():
				}
			}
			if ctx.Err() == nil && !ev.Done {
				t := time.NewTimer(g.gap)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
			switch {
			case ev.Done && ctx.Err() != nil:
				ev.Finish, ev.Err = parley.FinishCancelled, nil
				ev.Usage.CompletionTokens = released
			case ctx.Err() != nil:
				continue // decoded after the cancellation, from this model's view
			default:
				released++
			}
			out <- ev
		}
	}()
	return out, nil
}

func openPaced(tb testing.TB, gap time.Duration, mod func(*web.Config)) *stack {
	return openStack(tb, stackOpts{cfg: mod, generator: func(e *llm.Engine) chat.Generator {
		return &pacedGenerator{Engine: e, gap: gap}
	}})
}

// openGated is openPaced whose replies stop after hold tokens until the
// returned gate is closed (once: every reply after it runs through).
func openGated(tb testing.TB, gap time.Duration, hold int, mod func(*web.Config)) (*stack, chan struct{}) {
	gate := make(chan struct{})
	s := openStack(tb, stackOpts{cfg: mod, generator: func(e *llm.Engine) chat.Generator {
		return &pacedGenerator{Engine: e, gap: gap, hold: hold, gate: gate}
	}})
	return s, gate
}

// dropAbruptly ends a client's TCP connection with no close frame, the way
// a reload, a closed lid or a change of network does.
func dropAbruptly(ws *websocket.Conn) { ws.UnderlyingConn().Close() }

// startReply opens a new JSON-mode session, sends prompt with maxTokens and
// returns the socket, the session id and the first n token messages.
func startReply(tb testing.TB, s *stack, prompt string, maxTokens, n int) (*websocket.Conn, string, []jsonmode.Message) {
	tb.Helper()
	ws := dial(tb, s.url+"/ws?format=json", nil)
	id := readJSON(tb, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": prompt, "params": map[string]any{"max_tokens": maxTokens}})
	var toks []jsonmode.Message
	for len(toks) < n {
		m := readJSON(tb, ws)
		if m.Type != "token" {
			tb.Fatalf("want token %d, got %+v", len(toks)+1, m)
		}
		toks = append(toks, m)
	}
	return ws, id, toks
}

// clientView is the history a client holds after a resume: the session
// message's, and when a reply was in flight, its text so far plus the
// tokens that followed (checked against the done message's content).
func clientView(tb testing.TB, ws *websocket.Conn, open jsonmode.Message) []parley.Message {
	tb.Helper()
	msgs := open.Messages
	if open.Reply == nil {
		return msgs
	}
	if open.Reply.Status != "generating" || len(msgs) < 2 || msgs[len(msgs)-1].Role != parley.RoleAssistant {
		tb.Fatalf("a reply in flight must end the history: %+v", open)
	}
	toks, done := readUntilDone(tb, ws)
	text := msgs[len(msgs)-1].Content
	for i, tk := range toks {
		if tk.Seq != open.Reply.Seq+i+1 {
			tb.Fatalf("token %d after the snapshot has seq %d, want %d", i, tk.Seq, open.Reply.Seq+i+1)
		}
		text += tk.Text
	}
	if done.Type != "done" || text != done.Content {
		tb.Fatalf("snapshot text and the tokens after it %q do not make the reply %q (%+v)", text, done.Content, done)
	}
	msgs[len(msgs)-1].Content = done.Content
	return msgs
}

func sameMessages(a, b []parley.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Role != b[i].Role || a[i].Content != b[i].Content {
			return false
		}
	}
	return true
}

func stored(tb testing.TB, s *stack, id string) []parley.Message {
	tb.Helper()
	sess, _, err := s.sessions.Open(context.Background(), parley.Caller{}, id)
	if err != nil {
		tb.Fatal(err)
	}
	return sess.Messages
}

// TestResumeNeverShowsAStaleHistory is a race of resumed replies: prompt, drop
// the socket at the first token, reconnect at once with ?session=, and
// compare what the client holds with what the session holds a moment
// later. With a grace the reply goes on and the client follows it; without
// one the resume waits for the cancelled turn to be stored.
func TestResumeNeverShowsAStaleHistory(t *testing.T) {
	for _, grace := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("grace=%v", grace), func(t *testing.T) {
			s := openStack(t, stackOpts{cfg: func(c *web.Config) { c.ResumeGrace = grace }})
			for round := range 8 {
				ws, id, _ := startReply(t, s, "Once upon a time", 200, 1)
				dropAbruptly(ws)
				ws2 := dial(t, s.url+"/ws?format=json&session="+id, nil)
				open := readJSON(t, ws2)
				if open.Type != "session" || !open.Resumed {
					t.Fatalf("round %d: resume: %+v", round, open)
				}
				view := clientView(t, ws2, open)
				if len(view) != 2 {
					t.Fatalf("round %d: want the turn in the history, got %+v", round, view)
				}
				// The reply's done message may reach the client before the
				// turn is stored; what the client was shown must be what
				// the session holds once it is. A stale view (the turn
				// missing or cut short) never comes to match.
				var got []parley.Message
				if !waitFor(hangWait, func() bool { got = stored(t, s, id); return sameMessages(view, got) }) {
					t.Fatalf("round %d: the client was shown %d messages %+v\nthe session holds %d %+v", round, len(view), view, len(got), got)
				}
				ws2.Close()
			}
		})
	}
}

// TestResumePicksUpTheReply: a JSON client that has the first tokens drops,
// the reply goes on, and the client resumes with resume_from: it gets the
// tokens after its last one (no duplicate, none missing) and the done
// message, and the session holds the reply once.
func TestResumePicksUpTheReply(t *testing.T) {
	// The reply waits after 20 tokens until the client has resumed.
	s, gate := openGated(t, 3*time.Millisecond, 20, func(c *web.Config) { c.ResumeGrace = time.Minute })
	ws, id, first := startReply(t, s, "Once upon a time", 150, 10)
	for i, tk := range first {
		if tk.Seq != i+1 {
			t.Fatalf("token %d has seq %d", i, tk.Seq)
		}
	}
	dropAbruptly(ws)
	// The reply goes on with nobody there, up to its gate: in flight
	// whenever the resume comes.
	ws2 := dial(t, s.url+"/ws?format=json&resume_from=10&session="+id, nil)
	open := readJSON(t, ws2)
	close(gate)
	if open.Reply == nil || open.Reply.Seq < 10 {
		t.Fatalf("want the reply in flight in the session message, got %+v", open)
	}
	rest, done := readUntilDone(t, ws2)
	text := ""
	for _, tk := range append(first, rest...) {
		text += tk.Text
	}
	for i, tk := range rest {
		if tk.Seq != 11+i {
			t.Fatalf("resumed token %d has seq %d, want %d", i, tk.Seq, 11+i)
		}
	}
	if done.Type != "done" || text != done.Content || done.Usage.CompletionTokens != 10+len(rest) {
		t.Fatalf("10 + %d tokens make %q; done %+v", len(rest), text, done)
	}
	got := stored(t, s, id)
	if len(got) != 2 || got[1].Content != done.Content || got[1].Interrupted {
		t.Fatalf("want the whole reply stored once, got %+v", got)
	}
	// The socket goes on as any other.
	ws2.WriteJSON(map[string]any{"type": "prompt", "content": "And then?", "params": map[string]any{"max_tokens": 5}})
	if _, d := readUntilDone(t, ws2); d.Type != "done" {
		t.Fatalf("next prompt: %+v", d)
	}
}

// TestResumeTextMode: a text-mode client resumes with the bytes it has
// (resume_from) and gets the missing text, the rest and the sentinel; one
// without resume_from gets the whole reply.
func TestResumeTextMode(t *testing.T) {
	for _, withFrom := range []bool{true, false} {
		// The reply waits after 10 tokens until the client has resumed.
		s, gate := openGated(t, 3*time.Millisecond, 10, func(c *web.Config) { c.ResumeGrace = time.Minute })
		ws, res, err := websocket.DefaultDialer.Dial(s.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := res.Header.Get("X-Parley-Session")
		ws.WriteMessage(websocket.TextMessage, []byte("Lily found a red ball"))
		var have string
		for range 3 {
			ws.SetReadDeadline(time.Now().Add(hangWait))
			_, p, err := ws.ReadMessage()
			if err != nil || string(p) == web.Sentinel {
				t.Fatalf("piece: %q %v", p, err)
			}
			have += string(p)
		}
		dropAbruptly(ws)
		time.Sleep(50 * time.Millisecond)
		u := s.url + "/?session=" + id
		if withFrom {
			u += fmt.Sprintf("&resume_from=%d", len(have))
		} else {
			have = ""
		}
		ws2 := dial(t, u, nil)
		close(gate)
		have += strings.Join(readReply(t, ws2), "")
		got := stored(t, s, id)
		if len(got) != 2 || got[1].Content != have {
			t.Fatalf("resume_from %v: the client has %q\nthe session holds %+v", withFrom, have, got)
		}
		ws2.Close()
	}
}

// TestReplyCancelledAfterTheGrace: nobody comes back within the grace: the
// reply is cancelled, its slot freed, and its text so far stored marked
// interrupted, which a later resume shows.
func TestReplyCancelledAfterTheGrace(t *testing.T) {
	s := openPaced(t, 5*time.Millisecond, func(c *web.Config) { c.ResumeGrace = 200 * time.Millisecond })
	ws, id, _ := startReply(t, s, "Once upon a time", 400, 1)
	dropAbruptly(ws)
	// The turn is stored, interrupted, from its start (its prompt, then its
	// text so far at checkpoints): wait for the reply's log line, written
	// once its turn is committed.
	eventually(t, "the reply cancelled", func() bool { return s.logged("reply") == 1 })
	if st := s.engine.Stats(); st.SlotsBusy != 0 {
		t.Fatalf("slots busy after the grace: %+v", st)
	}
	ws2 := dial(t, s.url+"/ws?format=json&session="+id, nil)
	open := readJSON(t, ws2)
	if open.Reply != nil || len(open.Messages) != 2 || !open.Messages[1].Interrupted || open.Messages[1].Content == "" {
		t.Fatalf("after the grace: %+v", open)
	}
	if got := stored(t, s, id); len(got) != 2 || !got[1].Interrupted || got[1].Content != open.Messages[1].Content {
		t.Fatalf("after the grace the session holds %+v, the resume showed %+v", got, open.Messages)
	}
}

// TestReplyCancelledWhenItsBufferFills: a reply nobody follows may buffer
// ResumeBuffer tokens, not more, however long the grace.
func TestReplyCancelledWhenItsBufferFills(t *testing.T) {
	s := openPaced(t, time.Millisecond, func(c *web.Config) { c.ResumeGrace = time.Minute; c.ResumeBuffer = 20 })
	ws, id, _ := startReply(t, s, "Once upon a time", 400, 1)
	dropAbruptly(ws)
	eventually(t, "the reply cancelled at its buffer's bound", func() bool { return s.logged("reply") == 1 })
	if got := stored(t, s, id); len(got) != 2 || !got[1].Interrupted {
		t.Fatalf("after the cancel the session holds %+v", got)
	}
	toks, err := s.engine.Tokenize(stored(t, s, id)[1].Content)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) > 60 {
		t.Fatalf("a reply nobody followed went on for %d tokens past a bound of 20", len(toks))
	}
}

// TestDetachedRepliesCountAgainstTheClient: a reply going on without its
// socket holds the client's connection admission, so a client cannot park
// more replies than it may hold connections. The grace is long, so the
// admissions are released by the replies' ends (400 paced tokens), never
// by a grace that a busy machine let pass before the check.
func TestDetachedRepliesCountAgainstTheClient(t *testing.T) {
	s := openPaced(t, 5*time.Millisecond, func(c *web.Config) {
		c.ResumeGrace = time.Minute
		c.MaxConnsPerIP = 2
	})
	for range 2 {
		ws, _, _ := startReply(t, s, "Once upon a time", 400, 1)
		dropAbruptly(ws)
	}
	// Whether or not the server has seen the drops yet, both admissions
	// are held: by the sockets, or by the replies that outlive them.
	if code := upgradeStatus(t, s.url+"/ws?format=json", nil); code != http.StatusTooManyRequests {
		t.Fatalf("a third socket while two replies go on without theirs: status %d, want 429", code)
	}
	eventually(t, "the admissions released when the replies end", func() bool {
		return upgradeStatus(t, s.url+"/ws?format=json", nil) == http.StatusSwitchingProtocols
	})
}

// TestResumeFromIsChecked: a resume_from that is not a whole number is
// refused before the upgrade, with a 400 naming it.
func TestResumeFromIsChecked(t *testing.T) {
	s := openStack(t, stackOpts{})
	for _, bad := range []string{"x", "-1", "1.5"} {
		if code := upgradeStatus(t, s.url+"/ws?format=json&resume_from="+bad, nil); code != http.StatusBadRequest {
			t.Fatalf("resume_from=%s: status %d, want 400", bad, code)
		}
	}
}

// TestResumeUnderLoad is the resume measurement, scaled to a test: many
// JSON sessions at once, each resuming with ?session=, sending prompts and
// dropping its socket at the first token of some replies, then coming back
// at once. Every resume must show exactly the history the client can
// account for (what it saw before plus the reply it dropped), and at the
// end every session must hold exactly what its client was last told.
//
// The load is a number of prompts, not a time window: every session sends
// the same prompts whatever the machine's speed, so every run drops and
// resumes as often (a 4-second window on a busy machine let no
// session reach its sixth prompt).
func TestResumeUnderLoad(t *testing.T) {
	// Each session sends prompts over several connections (1, 2 or 3 a
	// connection) and drops every dropEvery-th at its first token: with 6
	// prompts, one drop and three resumes a session (about the work the
	// old 4-second window did on this 2-core machine).
	const sessions, prompts, dropEvery = 12, 6, 6 // about 15% of replies dropped
	s := openStack(t, stackOpts{maxTokens: 32, cfg: func(c *web.Config) { c.ResumeGrace = time.Minute }})
	type result struct {
		turns, drops, resumes int
		err                   error
	}
	results := make(chan result, sessions)
	for i := range sessions {
		go func() {
			var r result
			defer func() { results <- r }()
			var hist []parley.Message
			id, n := "", 0
			for n < prompts && r.err == nil {
				q := ""
				if id != "" {
					q, r.resumes = "&session="+id, r.resumes+1
				}
				ws, _, err := websocket.DefaultDialer.Dial(s.url+"/ws?format=json"+q, nil)
				if err != nil {
					r.err = err
					return
				}
				open := readJSON(t, ws)
				id = open.SessionID()
				view := clientView(t, ws, open)
				if len(view) < len(hist) || !sameMessages(view[:len(hist)], hist) || len(view) > len(hist)+2 {
					r.err = fmt.Errorf("session %d: resumed with %d messages, the client accounts for %d (+ at most its dropped turn)", i, len(view), len(hist))
				}
				if got := stored(t, s, id); !sameMessages(view, got) {
					r.err = fmt.Errorf("session %d: shown %d messages, the session holds %d", i, len(view), len(got))
				}
				hist = view
				for range min(1+n%3, prompts-n) {
					n++
					ws.WriteJSON(map[string]any{"type": "prompt", "content": fmt.Sprintf("Story %d of %d", n, i)})
					if n%dropEvery == 0 {
						readJSON(t, ws) // the first token
						r.drops++
						break
					}
					_, done := readUntilDone(t, ws)
					hist = append(hist, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("Story %d of %d", n, i)},
						parley.Message{Role: parley.RoleAssistant, Content: done.Content})
					r.turns++
				}
				dropAbruptly(ws)
			}
			// At the end: what the client was last told is what is stored
			// (a reply dropped last is followed to its end by clientView).
			ws := dial(t, s.url+"/ws?format=json&session="+id, nil)
			final := clientView(t, ws, readJSON(t, ws))
			if len(final) < len(hist) || !sameMessages(final[:len(hist)], hist) {
				r.err = fmt.Errorf("session %d: the history changed behind the client's back", i)
			}
			ws.Close()
		}()
	}
	var total result
	for range sessions {
		r := <-results
		if r.err != nil {
			t.Error(r.err)
		}
		total.turns, total.drops, total.resumes = total.turns+r.turns, total.drops+r.drops, total.resumes+r.resumes
	}
	t.Logf("%d sessions, %d prompts each: %d acknowledged turns, %d dropped at the first token, %d resumes, none stale",
		sessions, prompts, total.turns, total.drops, total.resumes)
	// Every prompt was either acknowledged or dropped, and the counts are
	// the fixed schedule's, on any machine.
	if want := sessions * prompts / dropEvery; total.drops != want || total.turns != sessions*prompts-want {
		t.Fatalf("%d turns and %d drops, want %d and %d", total.turns, total.drops, sessions*prompts-want, want)
	}
	if total.resumes < sessions*2 {
		t.Fatalf("%d resumes for %d sessions, want at least 2 each", total.resumes, sessions)
	}
}
