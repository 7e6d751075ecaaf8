package synth

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// scriptedReply writes spec with script and decodes greedily after prompt; it returns the reply's text with special
// tokens shown, and how it ended.
func scriptedReply(t *testing.T, script *Script, prompt string) (string, parley.FinishReason) {
	t.Helper()
	spec := smallSpec(t)
	spec.Script = script
	out := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := Write(context.Background(), out, spec); err != nil {
		t.Fatal(err)
	}
	eng, err := llm.Open(llm.Config{Path: out, ContextLength: 512, Parallel: 1, Threads: 1}) // one thread: see decodesCycle
	if err != nil {
		t.Fatalf("llama.cpp does not load the scripted model: %v", err)
	}
	defer eng.Close()
	if script.Template != "" && eng.Info().ChatTemplate != script.Template {
		t.Errorf("chat template %q, want the script's", eng.Info().ChatTemplate)
	}
	toks, err := eng.Tokenize(prompt)
	if err != nil {
		t.Fatal(err)
	}
	params := parley.DefaultParams()
	params.Temperature, params.RepeatPenalty, params.MaxTokens, params.Seed = 0, 1, 200, 1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // catches a hang only
	defer cancel()
	events, err := eng.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for ev := range events {
		if ev.Done {
			return text.String(), ev.Finish
		}
		text.WriteString(eng.TokenText(ev.Token.ID))
	}
	t.Fatal("no final event")
	return "", ""
}

func TestScriptedChatMLThinking(t *testing.T) {
	got, finish := scriptedReply(t, ChatMLThinking(), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
	want := strings.TrimSuffix(ChatMLThinking().Reply, "<|im_end|>")
	if strings.TrimPrefix(got, " ") != want && got != ChatMLThinking().Reply {
		t.Errorf("reply %q, want %q", got, want)
	}
	if finish != parley.FinishEOS {
		t.Errorf("finish %q, want eos at <|im_end|>", finish)
	}
}

func TestScriptedHarmonyRepeats(t *testing.T) {
	got, finish := scriptedReply(t, Harmony(), "<|start|>user<|message|>Which colour?<|end|><|start|>")
	want := strings.TrimSuffix(Harmony().Reply, "<|return|>")
	if got != want && got != Harmony().Reply {
		t.Errorf("reply %q, want %q", got, want)
	}
	if finish != parley.FinishEOS {
		t.Errorf("finish %q, want eos at <|return|>", finish)
	}
}

// TestScriptedThen: a script with a second reply after another token: a
// tool call after a user's turn, an answer after the tool's result; the two
// replies share no piece but end on the same end-of-turn token.
func TestScriptedThen(t *testing.T) {
	s := &Script{
		Control: []string{"<|im_start|>", "<|im_end|>", "<|answer|>"},
		Text:    []string{"<tool_call>", "</tool_call>"},
		After:   "\n",
		Reply:   `<tool_call>{"name": "Bash", "arguments": {"command": "echo hi"}}</tool_call>`,
		End:     "<|im_end|>",
		Then:    []Branch{{After: "<|answer|>", Reply: "The command said hi."}},
	}
	for prompt, want := range map[string]string{
		"<|im_start|>user\nRun it<|im_end|>\n<|im_start|>assistant\n":                                         s.Reply,
		"<|im_start|>user\nRun it<|im_end|>\n<|im_start|>tool\nhi<|im_end|>\n<|im_start|>assistant<|answer|>": "The command said hi.",
	} {
		got, finish := scriptedReply(t, s, prompt)
		if strings.TrimPrefix(got, " ") != want || finish != parley.FinishEOS {
			t.Errorf("after %q: reply %q (%s), want %q ended by <|im_end|>", prompt, got, finish, want)
		}
	}
}

func TestScriptRefusals(t *testing.T) {
	voc := vocabulary{tokens: []string{"<unk>", "<s>", "</s>", "<0x0A>", "\u2581a", "b"}, types: []int32{2, 3, 3, 6, 1, 1}}
	for name, s := range map[string]*Script{
		"after missing":    {After: "zzz", Reply: "ab"},
		"tail unspellable": {After: "\n", Reply: "bb"}, // the second "b" has no other spelling
		"token exists":     {After: "\n", Reply: "b", Control: []string{"b"}},
		"then after twice": {After: "\n", Reply: "b", Then: []Branch{{After: "\n", Reply: "a"}}},
	} {
		if _, err := s.apply(voc, 2); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	sc, err := (&Script{After: "\n", Reply: " ab"}).apply(voc, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{3, 4, 5, 2}; len(sc.chains) != 1 || !slices.Equal(sc.chains[0], want) {
		t.Errorf("chains %v, want %v", sc.chains, want)
	}
	// A repeat is spelled with an invented piece: " ab ab" is ▁a b, then ▁ab (new) once more... every piece once.
	sc, err = (&Script{After: "\n", Reply: " ab ab!"}).apply(voc, 2)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	var text strings.Builder
	chain := sc.chains[0]
	for _, id := range chain[1 : len(chain)-1] {
		if seen[id] {
			t.Errorf("piece %d used twice in %v", id, chain)
		}
		seen[id] = true
		text.WriteString(strings.ReplaceAll(sc.voc.tokens[id], wordStart, " "))
	}
	if text.String() != " ab ab!" {
		t.Errorf("chain spells %q", text.String())
	}
}
