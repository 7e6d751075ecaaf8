package llm_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// synthDraft writes a small synthetic model with stories260K's vocabulary
// (padded to vocabSize tokens when above it) and returns its path.
func synthDraft(tb testing.TB, vocabSize int) string {
	tb.Helper()
	spec := synth.DefaultSpec()
	spec.VocabFrom = testmodel.Path(tb)
	spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN, spec.Context = 2, 64, 4, 2, 128, 2048
	spec.VocabSize = vocabSize
	out := filepath.Join(tb.TempDir(), "draft.gguf")
	if _, err := synth.Write(context.Background(), out, spec); err != nil {
		tb.Fatalf("draft model: %v", err)
	}
	return out
}

// TestDraftModelSameTokens: with a draft model (the target itself, whose
// drafts hold, and a synthetic one of the same vocabulary, whose drafts
// mostly miss), greedy replies are the same tokens as without, with the
// same logprobs (within logprobTolerance) and finish, plain, under a
// grammar and a JSON schema, and stopped by a stop string; on both engines.
func TestDraftModelSameTokens(t *testing.T) {
	prompt := "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom"
	lower := greedy(80)
	lower.Grammar = `root ::= [ a-z.]+`
	schema := greedy(100)
	schema.JSONSchema = []byte(`{"type":"object","properties":{"name":{"type":"string","maxLength":30},"ball":{"enum":["red","blue"]}},"required":["name","ball"],"additionalProperties":false}`)
	synthetic := synthDraft(t, 0)
	for _, engine := range []string{llm.EngineEmbedded, llm.EngineCurrent} {
		for name, dm := range map[string]string{"self": testmodel.Path(t), "synthetic": synthetic} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				cfg := llm.Config{Path: testmodel.Path(t), Threads: 1, Parallel: 2, ContextLength: 512, Engine: engine, LibDir: currentLibDir(t)}
				on := cfg
				on.Draft, on.DraftModel = llm.DraftNgram, dm
				eOff, eOn := mustOpen(t, cfg), mustOpen(t, on)
				for _, kind := range []string{"plain", "grammar", "schema"} {
					p := map[string]parley.Params{"plain": greedy(100), "grammar": lower, "schema": schema}[kind]
					if err := p.Validate(0); err != nil {
						t.Fatal(err)
					}
					before := eOn.Stats()
					prompts := []string{prompt, draftPrompts[0], draftPrompts[2]}
					want := replies(t, eOff, prompts, p)
					got := replies(t, eOn, prompts, p)
					for i := range prompts {
						sameReply(t, kind, got[i], want[i])
					}
					after := eOn.Stats()
					drafted, held := after.DraftTokens-before.DraftTokens, after.DraftAccepted-before.DraftAccepted
					t.Logf("%s: drafted %d, held %d", kind, drafted, held)
					// Unconstrained, the target's own greedy drafts hold
					// (the grammars refuse some of what it drafts).
					if name == "self" && kind == "plain" && held*10 < drafted*9 {
						t.Errorf("the target as its own draft model: %d of %d draft tokens held, want nearly all", held, drafted)
					}
				}
				st := eOn.Stats()
				t.Logf("drafted %d, held %d, generated %d", st.DraftTokens, st.DraftAccepted, st.TokensGenerated)
				if st.DraftTokens == 0 {
					t.Error("the draft model drafted nothing")
				}
				// A stop string: the same text up to it with the draft model as without.
				plain := generate(t, eOff, "plain", prompt, greedy(120)).text
				if len(plain) < 60 {
					t.Fatalf("reply %q too short to stop in", plain)
				}
				stops := greedy(120)
				stops.Stop = []string{plain[40:52]}
				for label, e := range map[string]*llm.Engine{"off": eOff, "on": eOn} {
					rep, err := chat.NewResponder(e).Complete(context.Background(), parley.ReplyRequest{Key: "stop", Prompt: prompt, Params: stops})
					if err != nil {
						t.Fatal(err)
					}
					var text string
					for ev := range rep.Events() {
						if !ev.Done {
							text += ev.Token.Text
						}
					}
					if before := plain[:strings.Index(plain, stops.Stop[0])]; text != before {
						t.Errorf("%s: stop %q: %q, want %q", label, stops.Stop[0], text, before)
					}
				}
			})
		}
	}
}

// TestDraftModelVocabulary: a draft model whose vocabulary is not the
// model's is refused at load, saying so.
func TestDraftModelVocabulary(t *testing.T) {
	_, err := llm.Open(llm.Config{Path: testmodel.Path(t), Threads: 1, Parallel: 1, ContextLength: 256,
		DraftModel: synthDraft(t, 1024)})
	if err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Fatalf("a draft model of 1024 tokens for a 512-token model: %v, want a vocabulary error", err)
	}
}

// TestDraftModelBacksOff: drafts from a synthetic draft model of random
// weights almost never hold; auto mode, which weighs each draft token's
// chance of holding against its cost (the draft model's decode included),
// drafts far fewer of them than ngram mode, which always drafts, for the
// same replies.
func TestDraftModelBacksOff(t *testing.T) {
	dm := synthDraft(t, 0)
	drafted := map[string]int64{}
	var ids []string
	for _, mode := range []string{llm.DraftNgram, llm.DraftAuto} {
		e := mustOpen(t, llm.Config{Path: testmodel.Path(t), Threads: 1, Parallel: 1, ContextLength: 512, Draft: mode, DraftModel: dm})
		var text string
		for _, pr := range draftPrompts {
			text += generate(t, e, "k", pr, greedy(100)).text
		}
		ids = append(ids, text)
		st := e.Stats()
		drafted[mode] = st.DraftTokens
		t.Logf("%s: drafted %d, held %d, generated %d", mode, st.DraftTokens, st.DraftAccepted, st.TokensGenerated)
	}
	if ids[0] != ids[1] {
		t.Errorf("the replies differ between the modes:\n%q\n%q", ids[0], ids[1])
	}
	if drafted[llm.DraftAuto]*2 > drafted[llm.DraftNgram] {
		t.Errorf("auto drafted %d tokens, ngram %d: auto should back off from drafts that miss", drafted[llm.DraftAuto], drafted[llm.DraftNgram])
	}
}

// TestDraftModelToolCall: the scripted Hermes model writes the same text
// and tool call with a draft model as without, through the lazy call
// grammar, on both engines. The draft models: the target itself (its
// drafts hold, but for those past the reply's end) and a smaller scripted
// model whose reply has the same words in another order ("Let me look up
// that." against "Let me look that up.": the same vocabulary), so that its
// drafts miss where the two part and hold again from the call's trigger
// on, under the call grammar.
func TestDraftModelToolCall(t *testing.T) {
	model := testmodel.Scripted(t, hermesScript())
	other := hermesScript()
	other.Reply = strings.Replace(other.Reply, "Let me look that up.", "Let me look up that.", 1)
	spec := synth.DefaultSpec()
	spec.VocabFrom, spec.Script, spec.Seed = testmodel.Path(t), other, 7
	spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN, spec.Context = 2, 64, 4, 2, 128, 2048
	otherPath := filepath.Join(t.TempDir(), "other.gguf")
	if _, err := synth.Write(context.Background(), otherPath, spec); err != nil {
		t.Fatal(err)
	}
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Weather in Paris?"}}
	p := greedy(100)
	p.Tools = toolSchemas
	for _, engine := range []string{llm.EngineEmbedded, llm.EngineCurrent} {
		cfg := llm.Config{Path: model, ContextLength: 2048, Parallel: 1, Threads: 1, Engine: engine, LibDir: currentLibDir(t)}
		want := replyWithTools(t, chat.NewResponder(mustOpen(t, cfg)), msgs, p)
		if want.final.Finish != parley.FinishToolCalls || len(want.final.ToolCalls) != 1 {
			t.Fatalf("%s without a draft model: finish %s (%v), calls %+v, content %q", engine, want.final.Finish, want.final.Err, want.final.ToolCalls, want.content)
		}
		for name, dm := range map[string]string{"self": model, "other": otherPath} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				on := cfg
				on.Draft, on.DraftModel = llm.DraftNgram, dm
				e := mustOpen(t, on)
				got := replyWithTools(t, chat.NewResponder(e), msgs, p)
				if got.final.Finish != parley.FinishToolCalls || len(got.final.ToolCalls) != 1 {
					t.Fatalf("finish %s (%v), calls %+v, content %q", got.final.Finish, got.final.Err, got.final.ToolCalls, got.content)
				}
				validateCall(t, toolSchemas, got.final.ToolCalls[0])
				if got.content != want.content || got.final.ToolCalls[0].Name != want.final.ToolCalls[0].Name ||
					got.final.ToolCalls[0].Arguments != want.final.ToolCalls[0].Arguments {
					t.Errorf("with the draft model %q %+v, without %q %+v", got.content, got.final.ToolCalls[0], want.content, want.final.ToolCalls[0])
				}
				st := e.Stats()
				t.Logf("drafted %d, held %d of %d tokens", st.DraftTokens, st.DraftAccepted, st.TokensGenerated)
				switch {
				case st.DraftTokens == 0:
					t.Error("the draft model drafted nothing")
				case name == "self" && st.DraftAccepted*5 < st.DraftTokens*4:
					t.Errorf("the target as its own draft model: %d of %d draft tokens held, want at least 4 in 5", st.DraftAccepted, st.DraftTokens)
				case name == "other" && st.DraftAccepted == st.DraftTokens:
					t.Errorf("every one of %d draft tokens held, though the draft model's reply differs", st.DraftTokens)
				}
			})
		}
	}
}
