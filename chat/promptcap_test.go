package chat_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// limitGen is fakeGen that tokenizes with a limit (chat.LimitTokenizer) and
// records each limit it was given.
type limitGen struct {
	*fakeGen
	mu     sync.Mutex
	limits []int
}

func (g *limitGen) TokenizeLimit(_ context.Context, text string, limit int) ([]int, error) {
	g.mu.Lock()
	g.limits = append(g.limits, limit)
	g.mu.Unlock()
	toks, err := g.Tokenize(text)
	if err == nil && limit > 0 && len(toks) > limit+1 {
		toks = toks[:limit+1] // known to be over: a prefix, as the engine returns it
	}
	return toks, err
}

// TestMaxPromptTokensOfTheRequest: the request's MaxPromptTokens caps the
// rendered prompt: over it the reply is refused as a prompt over a limit
// (parley.PromptLimit names the cap), tokenized only until it is over the
// cap rather than over the context's budget; within it the one count's
// tokens are the prompt generated from.
func TestMaxPromptTokensOfTheRequest(t *testing.T) {
	gen := &limitGen{fakeGen: newFake(4096, chat.NameChatML, piece{text: "hi"})}
	r := chat.NewResponder(gen)
	long := []parley.Message{user(strings.Repeat("word ", 50))}
	_, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: long, Params: params(8), MaxPromptTokens: 20})
	if n, limit, ok := parley.PromptLimit(err); !ok || limit != 20 || n <= 20 {
		t.Fatalf("over the cap: %v (tokens %d, limit %d), want a prompt over the limit of 20", err, n, limit)
	}
	if len(gen.limits) != 1 || gen.limits[0] != 20 {
		t.Errorf("tokenized with limits %v, want one count stopping at the cap (20)", gen.limits)
	}

	gen.limits = nil
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: []parley.Message{user("a short one")}, Params: params(8), MaxPromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	gen.wait(t)
	if len(gen.limits) != 1 || len(gen.lastRequest(t).Tokens) > 100 {
		t.Errorf("within the cap: %d counts, %d tokens generated from", len(gen.limits), len(gen.lastRequest(t).Tokens))
	}
}

// TestClientReachesTheEngine: the request's client is the engine request's,
// for a reply and for a raw completion, so the engine queues and caps per
// client with no context value.
func TestClientReachesTheEngine(t *testing.T) {
	gen := newFake(4096, chat.NameChatML, piece{text: "hi"})
	r := chat.NewResponder(gen)
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: []parley.Message{user("hello")}, Params: params(4), Client: "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	gen.wait(t)
	if c := gen.lastRequest(t).Client; c != "10.0.0.1" {
		t.Errorf("Reply: the engine's request names client %q, want 10.0.0.1", c)
	}
	rep, err = r.Complete(context.Background(), parley.ReplyRequest{Prompt: "once upon", Params: params(4), Client: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	gen.wait(t)
	if c := gen.lastRequest(t).Client; c != "alice" {
		t.Errorf("Complete: the engine's request names client %q, want alice", c)
	}
}
