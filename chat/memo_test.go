package chat_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// contGen is the fake engine with TokenizeContinuation: one token per word,
// no BOS.
type contGen struct{ *fakeGen }

func (g contGen) TokenizeContinuation(text string) ([]int, error) {
	var toks []int
	for i := range strings.Fields(text) {
		toks = append(toks, 500+i)
	}
	return toks, nil
}

// The second turn's prompt is the first prompt's tokens, then the generated
// tokens exactly as generated (a control token the reply text left out
// included), then only the new text's tokens; a conversation that does not
// continue the first (another history under the same key) is tokenized whole.
func TestReplyReusesExactTokens(t *testing.T) {
	f := newFake(512, "", piece{text: " Once"}, piece{text: "<s>", special: true}, piece{text: " upon"}, piece{text: " a"})
	g := contGen{f}
	r := chat.NewResponder(g)
	p := parley.DefaultParams()
	p.MaxTokens = 4
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Tell me a story."}}
	rep, err := r.Reply(context.Background(), "k", msgs, p)
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	if rep.Text() != " Once upon a" {
		t.Fatalf("text %q", rep.Text())
	}
	first := f.reqs[0].Tokens

	msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()}, parley.Message{Role: parley.RoleUser, Content: "More please."})
	rep, err = r.Reply(context.Background(), "k", msgs, p)
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	second := f.reqs[1].Tokens
	want := append(append(slices.Clone(first), 100, 101, 102, 103), 500, 501, 502, 503) // "User: More please. Assistant:" as 4 words
	if !slices.Equal(second, want) {
		t.Fatalf("second prompt %v, want %v", second, want)
	}

	// Another conversation under the same key: whole tokenization (BOS first).
	other := []parley.Message{{Role: parley.RoleUser, Content: "Something else"}, {Role: parley.RoleAssistant, Content: "ok"}, {Role: parley.RoleUser, Content: "and more"}}
	rep, err = r.Reply(context.Background(), "k", other, p)
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	if got := f.reqs[2].Tokens; got[0] != 1 || slices.Contains(got, 500) {
		t.Fatalf("unrelated conversation got tokens %v", got)
	}
}
