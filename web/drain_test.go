package web_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/web"
)

// stuckGenerator is the real engine with a step that never returns: each
// stream forwards its first `pass` events, then stops and ignores
// cancellation until release is closed, the way a call stuck inside
// llama.cpp would. (The engine itself ends every sequence within one step
// of its cancellation; this is what happens when a step does not.)
type stuckGenerator struct {
	*llm.Engine
	pass    int
	release chan struct{}
	stuck   chan struct{} // a send per stream that reached its stuck point
}

func (g *stuckGenerator) Generate(ctx context.Context, req parley.GenerateRequest) (<-chan parley.Event, error) {
	req.Params.MaxTokens = 200
	in, err := g.Engine.Generate(context.WithoutCancel(ctx), req)
	if err != nil {
		return nil, err
	}
	out := make(chan parley.Event, 256)
	go func() {
		defer close(out)
		n := 0
		for ev := range in {
			if n == g.pass {
				g.stuck <- struct{}{}
				<-g.release
			}
			n++
			out <- ev
		}
	}()
	return out, nil
}

// TestCloseBoundedWhenAStepNeverReturns: with replies stuck inside the
// engine on a WebSocket and on an HTTP stream, Close returns (the stuck
// steps never do: Close does not wait for them), the socket is closed with 1001, the
// stream ends, and the WebSocket's turn is stored with the text it had
// delivered (an acknowledged turn is never lost).
func TestCloseBoundedWhenAStepNeverReturns(t *testing.T) {
	const drain = 500 * time.Millisecond
	g := &stuckGenerator{pass: 3, release: make(chan struct{}), stuck: make(chan struct{}, 2)}
	t.Cleanup(func() { close(g.release) })
	h := openStack(t, stackOpts{tokenizer: true,
		cfg: func(c *web.Config) { c.DrainTimeout = drain },
		generator: func(e *llm.Engine) chat.Generator {
			g.Engine = e
			return g
		},
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})

	ws, res, err := websocket.DefaultDialer.Dial(h.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	id := res.Header.Get("X-Parley-Session")
	if err := ws.WriteMessage(websocket.TextMessage, []byte("Once upon a time")); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	ws.SetReadDeadline(time.Now().Add(hangWait))
	for range 3 {
		_, p, err := ws.ReadMessage()
		if err != nil || string(p) == web.Sentinel {
			t.Fatalf("piece: %q %v", p, err)
		}
		got.Write(p)
	}

	// An HTTP stream stuck the same way.
	streamDone := make(chan error, 1)
	go func() {
		res, err := http.Post(h.base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"stream": true, "messages": [{"role": "user", "content": "Lily"}]}`))
		if err != nil {
			streamDone <- err
			return
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
		}
		streamDone <- sc.Err()
	}()
	for range 2 { // both streams are stuck
		select {
		case <-g.stuck:
		case err := <-streamDone:
			t.Fatalf("the stream ended before it was stuck: %v", err)
		case <-time.After(hangWait):
			t.Fatal("the streams never reached their stuck step")
		}
	}

	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- h.srv.Close(context.Background()) }()
	ws.SetReadDeadline(time.Now().Add(hangWait))
	for {
		_, p, err := ws.ReadMessage()
		if err != nil {
			if !websocket.IsCloseError(err, websocket.CloseGoingAway) {
				t.Fatalf("read: %v, want a 1001 close", err)
			}
			break
		}
		got.Write(p)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(drain + hangWait):
		t.Fatal("Close hangs on a stuck step")
	}
	// The steps are still stuck (released only at cleanup): Close
	// returning at all is the check; its time is the machine's.
	t.Logf("Close took %v with a %v drain", time.Since(start), drain)
	select {
	case <-streamDone:
	case <-time.After(hangWait):
		t.Fatal("the HTTP stream is still open after Close")
	}

	sess, _, err := h.sessions.Open(context.Background(), parley.Caller{}, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.Messages) != 2 || sess.Messages[0].Content != "Once upon a time" {
		t.Fatalf("stored conversation: %+v", sess.Messages)
	}
	if want := got.String(); sess.Messages[1].Content != want || want == "" {
		t.Fatalf("stored reply %q, delivered %q", sess.Messages[1].Content, want)
	}
}

// queuedGenerator holds every prompt as if it waited in the engine's queue
// behind busy slots: no token ever comes, and when its context ends the
// stream ends cancelled.
type queuedGenerator struct {
	*llm.Engine
	queued chan struct{} // a send per prompt that is waiting
}

func (g *queuedGenerator) Generate(ctx context.Context, req parley.GenerateRequest) (<-chan parley.Event, error) {
	out := make(chan parley.Event, 1)
	go func() {
		defer close(out)
		g.queued <- struct{}{}
		<-ctx.Done()
		out <- parley.Event{Done: true, Finish: parley.FinishCancelled}
	}()
	return out, nil
}

// TestPromptQueuedAtShutdownIsKept: a chat prompt still waiting for the
// engine when the drain ends is not lost: its session stores it, with an
// empty reply marked interrupted, so the client that reconnects finds it.
func TestPromptQueuedAtShutdownIsKept(t *testing.T) {
	g := &queuedGenerator{queued: make(chan struct{}, 1)}
	h := openStack(t, stackOpts{
		cfg: func(c *web.Config) { c.DrainTimeout = 100 * time.Millisecond },
		generator: func(e *llm.Engine) chat.Generator {
			g.Engine = e
			return g
		}})
	ws, res, err := websocket.DefaultDialer.Dial(h.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	id := res.Header.Get("X-Parley-Session")
	if err := ws.WriteMessage(websocket.TextMessage, []byte("Once upon a time")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.queued:
	case <-time.After(time.Minute):
		t.Fatal("the prompt never reached the engine")
	}
	if err := h.srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	sess, err := h.sessions.Conversation(context.Background(), parley.Caller{}, id)
	if err != nil {
		t.Fatal(err)
	}
	msgs := sess.Messages
	if len(msgs) != 2 || msgs[0].Role != parley.RoleUser || msgs[0].Content != "Once upon a time" ||
		msgs[1].Role != parley.RoleAssistant || !msgs[1].Interrupted || msgs[1].Content != "" {
		t.Fatalf("the session after the shutdown holds %+v, want the prompt and an interrupted empty reply", msgs)
	}
}
