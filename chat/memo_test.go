package chat_test

import (
	"context"
	"regexp"
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
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	if rep.Text() != " Once upon a" {
		t.Fatalf("text %q", rep.Text())
	}
	first := f.reqs[0].Tokens

	msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()}, parley.Message{Role: parley.RoleUser, Content: "More please."})
	rep, err = r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
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
	rep, err = r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: other, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	if got := f.reqs[2].Tokens; got[0] != 1 || slices.Contains(got, 500) {
		t.Fatalf("unrelated conversation got tokens %v", got)
	}
}

// A reply that does not begin with a space, or ends with whitespace, renders
// differently from what the model generated under most templates (the plain
// transcript writes "Assistant: " + the stripped reply; llama3 and gemma strip
// it). The next prompt must still hold every generated token as generated,
// so the KV cache is reused over the whole reply, for every template.
func TestReplyKeepsGeneratedTokensWhateverTheTemplateDoesToWhitespace(t *testing.T) {
	replies := map[string][]piece{
		"no leading space":    {{text: `"Once`}, {text: " upon"}, {text: " a"}, {text: " time."}},
		"trailing whitespace": {{text: " Once"}, {text: " upon"}, {text: " a"}, {text: " time."}, {text: "\n"}},
		"both":                {{text: "\n"}, {text: "Once"}, {text: " upon"}, {text: " time"}, {text: " "}},
	}
	for _, name := range chat.TemplateNames() {
		for what, steps := range replies {
			t.Run(name+"/"+what, func(t *testing.T) {
				tmpl, err := chat.TemplateByName(name)
				if err != nil {
					t.Fatal(err)
				}
				f := newFake(512, "", steps...)
				r := chat.NewResponder(contGen{f}, chat.WithTemplate(tmpl))
				p := parley.DefaultParams()
				p.MaxTokens = len(steps)
				msgs := []parley.Message{{Role: parley.RoleUser, Content: "Tell me a story."}}
				rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
				if err != nil {
					t.Fatal(err)
				}
				collect(t, rep)
				msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()}, parley.Message{Role: parley.RoleUser, Content: "More please."})
				rep, err = r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
				if err != nil {
					t.Fatal(err)
				}
				collect(t, rep)
				want := slices.Clone(f.reqs[0].Tokens)
				for i := range steps {
					want = append(want, 100+i)
				}
				second := f.reqs[1].Tokens
				if len(second) <= len(want) || !slices.Equal(second[:len(want)], want) {
					t.Fatalf("reply %q: second prompt %v does not continue the first prompt and the generated tokens %v", rep.Text(), second, want)
				}
			})
		}
	}
}

// matchPiece never lets whitespace stand for text, nor text for other text.
func TestReplyRetokenizesARewrittenReply(t *testing.T) {
	f := newFake(512, "", piece{text: " Once"}, piece{text: " upon"}, piece{text: " a"})
	r := chat.NewResponder(contGen{f})
	p := parley.DefaultParams()
	p.MaxTokens = 3
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Tell me a story."}}
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	// The client rewrote the reply's second word.
	msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: " Once below a"}, parley.Message{Role: parley.RoleUser, Content: "More."})
	rep, err = r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	second := f.reqs[1].Tokens
	first := f.reqs[0].Tokens
	if !slices.Equal(second[:len(first)+1], append(slices.Clone(first), 100)) || slices.Contains(second, 101) || slices.Contains(second, 102) {
		t.Fatalf("second prompt %v: want the first prompt, the one generated token the text still holds, then new tokens", second)
	}
}

// savedGen is contGen with the tokens of a saved KV state (llm.Engine with
// its KV swap on), as after a restart.
type savedGen struct {
	contGen
	saved []parley.Token
}

func (g savedGen) SavedTokens(key string) []parley.Token {
	if key != "k" {
		return nil
	}
	return g.saved
}

// After a restart the Responder remembers nothing of the conversation, but
// the engine has its saved state: the next prompt continues that state's
// tokens (whitespace the tokenizer put before the first word, and the
// template's "Assistant: " before a reply with no leading space, included),
// so only the new text is evaluated.
func TestReplyContinuesSavedTokensAfterRestart(t *testing.T) {
	steps := []piece{{text: `"Once`}, {text: " upon"}, {text: " a"}, {text: " time."}}
	f := newFake(512, "", steps...)
	r := chat.NewResponder(contGen{f})
	p := parley.DefaultParams()
	p.MaxTokens = len(steps)
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Tell me a story."}}
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)

	// The state the engine saved: BOS, the first prompt in pieces (the
	// first with the space a SentencePiece tokenizer adds), the reply.
	saved := []parley.Token{{ID: 1, Text: "<s>", Special: true}}
	for i, w := range regexp.MustCompile(`\s*\S+|\s+`).FindAllString(rep.Prompt(), -1) {
		if i == 0 {
			w = " " + w
		}
		saved = append(saved, parley.Token{ID: 300 + i, Text: w})
	}
	for i, s := range steps {
		saved = append(saved, parley.Token{ID: 100 + i, Text: s.text})
	}
	f2 := newFake(512, "", steps...)
	r2 := chat.NewResponder(savedGen{contGen{f2}, saved})
	msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: rep.Text()}, parley.Message{Role: parley.RoleUser, Content: "More please."})
	rep, err = r2.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: msgs, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	got := f2.reqs[0].Tokens
	want := make([]int, len(saved))
	for i, s := range saved {
		want[i] = s.ID
	}
	if len(got) <= len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("prompt after the restart %v does not continue the saved tokens %v", got, want)
	}

	// A conversation that leaves the saved state keeps only the saved
	// tokens its text still holds ("User:"), then tokenizes the rest.
	other := []parley.Message{{Role: parley.RoleUser, Content: "Something else entirely"}}
	rep, err = r2.Reply(context.Background(), parley.ReplyRequest{Key: "k", Messages: other, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	if got := f2.reqs[1].Tokens; !slices.Equal(got[:3], []int{1, 300, 500}) || slices.Contains(got, 301) {
		t.Fatalf("an unrelated conversation got %v", got)
	}
}
