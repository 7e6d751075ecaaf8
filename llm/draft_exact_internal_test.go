package llm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
)

// invariantLogits is a backend whose logits for a batch row are a function
// of the row's token and position alone, the same whatever else the step
// evaluated. llama.cpp's are not: a step that evaluates several positions
// of one sequence (its draft) sums in another order than a step of one,
// which moves stories260K's logprobs by up to about 1e-2, so a seeded draw
// that falls that close to the boundary between two tokens takes the other
// one. Over these logits only the engine's speculation could make a reply
// differ, so a test can ask for exactly the same tokens.
//
// Each token has a favourite successor, with a logit of 5.5 against noise
// in [-2, 2] for the rest: every token leads into a cycle of a few
// lower-case words and one capitalized one (which the tests' grammar
// refuses). A sampled reply goes round the cycle most of the time, so its
// history repeats and its drafts hold, and leaves it often enough that
// drafts also miss. Only the loop calls Decode and Logits.
type invariantLogits struct {
	backend
	nv    int
	cycle []int             // the cycle's tokens; cycle[i] is followed by cycle[i+1]
	next  map[int]int       // a cycle token's successor
	rows  [][2]int32        // the last step's rows: token, position
	cache map[int][]float32 // row -> its logits, until the next Decode
}

func newInvariantLogits(be backend) backend {
	b := &invariantLogits{backend: be, nv: be.NumVocab(), next: map[int]int{}, cache: map[int][]float32{}}
	lower, upper := []int{}, []int{}
	for v := range b.nv {
		w := strings.TrimSpace(be.TokenToPiece(v))
		switch {
		case len(w) < 3:
		case strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") == "":
			lower = append(lower, v)
		case w[0] >= 'A' && w[0] <= 'Z' && strings.Trim(w[1:], "abcdefghijklmnopqrstuvwxyz") == "":
			upper = append(upper, v)
		}
	}
	if len(lower) >= 5 && len(upper) >= 1 {
		b.cycle = []int{lower[0], lower[1], lower[2], upper[0], lower[3], lower[4]}
	}
	for i, v := range b.cycle {
		b.next[v] = b.cycle[(i+1)%len(b.cycle)]
	}
	return b
}

func (b *invariantLogits) Decode(bt *batch) error {
	if err := b.backend.Decode(bt); err != nil {
		return err
	}
	b.rows = b.rows[:0]
	for i := range bt.tok {
		b.rows = append(b.rows, [2]int32{bt.tok[i], bt.pos[i]})
	}
	clear(b.cache)
	return nil
}

func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func (b *invariantLogits) Logits(i int) []float32 {
	if l, ok := b.cache[i]; ok {
		return l
	}
	tok, pos := int(b.rows[i][0]), int(b.rows[i][1])
	l := make([]float32, b.nv)
	for v := range l {
		l[v] = float32(mix64(uint64(tok)<<40^uint64(pos)<<20^uint64(v))%4001)/1000 - 2
	}
	if len(b.cycle) > 0 {
		succ, ok := b.next[tok]
		if !ok {
			succ = b.cycle[0]
		}
		l[succ] = 5.5
	}
	b.cache[i] = l
	return l
}

// TestDraftSampledExact: over logits that do not depend on the step's
// other rows, seeded sampled replies (with and without a grammar, with the
// repetition penalty) and greedy ones are the same tokens, with the same
// logprobs, with drafts as without, for every seed: N runs, no divergence.
// Two prompts share the steps, so a sequence's draft rows sit beside the
// other's input and prompt.
func TestDraftSampledExact(t *testing.T) {
	prompts := []string{
		"Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom",
		"Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time, there was",
	}
	const seeds = 12
	for _, engine := range []string{EngineEmbedded, EngineCurrent} {
		t.Run(engine, func(t *testing.T) {
			cfg := Config{Path: testmodel.Path(t), Threads: 1, Parallel: 2, ContextLength: 512, Engine: engine,
				LibDir: testLibDir(), wrapBackend: newInvariantLogits}
			off, on := cfg, cfg
			off.Draft, on.Draft = DraftOff, DraftNgram
			eOff, eOn := mustOpenInternal(t, off), mustOpenInternal(t, on)
			if c := eOn.be.(*invariantLogits).cycle; len(c) == 0 {
				t.Fatal("the vocabulary has too few lower-case and capitalized words for the logits' cycle")
			}
			runs, diverged := 0, 0
			for _, kind := range []string{"sampled", "sampled+grammar", "greedy+grammar"} {
				before := eOn.Stats()
				for seed := range seeds {
					p := parley.DefaultParams()
					p.Temperature, p.TopK, p.TopP, p.MinP, p.MaxTokens, p.Seed = 0.8, 40, 0.95, 0, 60, int64(seed)
					switch kind {
					case "sampled+grammar":
						p.Grammar = `root ::= [ a-z.]+`
					case "greedy+grammar":
						p.Temperature, p.RepeatPenalty = 0, 1
						p.Grammar = `root ::= [ a-z.]+`
					}
					if err := p.Validate(0); err != nil {
						t.Fatal(err)
					}
					want := generateAll(t, eOff, prompts, p)
					got := generateAll(t, eOn, prompts, p)
					for i := range prompts {
						runs++
						if !slices.Equal(got[i].ids, want[i].ids) || !slices.Equal(got[i].lps, want[i].lps) ||
							got[i].final.Finish != want[i].final.Finish {
							diverged++
							t.Errorf("%s seed %d prompt %d: with drafts %v (%s)\nwithout %v (%s)", kind, seed, i,
								got[i].ids, got[i].final.Finish, want[i].ids, want[i].final.Finish)
						}
					}
				}
				after := eOn.Stats()
				t.Logf("%s: drafted %d, held %d", kind, after.DraftTokens-before.DraftTokens, after.DraftAccepted-before.DraftAccepted)
			}
			st := eOn.Stats()
			t.Logf("%d runs, %d diverged; drafted %d, held %d, generated %d", runs, diverged, st.DraftTokens, st.DraftAccepted, st.TokensGenerated)
			if st.DraftAccepted == 0 || st.DraftAccepted == st.DraftTokens {
				t.Errorf("drafted %d, held %d: the test wants drafts that hold and drafts that miss", st.DraftTokens, st.DraftAccepted)
			}
		})
	}
}

type exactResult struct {
	ids   []int
	lps   []float64
	final parley.Event
}

// generateAll runs every prompt at once on e with p.
func generateAll(t *testing.T, e *Engine, prompts []string, p parley.Params) []exactResult {
	t.Helper()
	chans := make([]<-chan parley.Event, len(prompts))
	for i, pr := range prompts {
		toks, err := e.Tokenize(pr)
		if err != nil {
			t.Fatal(err)
		}
		if chans[i], err = e.Generate(context.Background(), parley.GenerateRequest{Key: fmt.Sprint(i), Tokens: toks, Params: p}); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]exactResult, len(prompts))
	for i, ch := range chans {
		for ev := range ch {
			if ev.Done {
				out[i].final = ev
				continue
			}
			out[i].ids = append(out[i].ids, ev.Token.ID)
			out[i].lps = append(out[i].lps, ev.Token.Logprob)
		}
		if out[i].final.Err != nil {
			t.Fatalf("%q: %v", prompts[i], out[i].final.Err)
		}
	}
	return out
}

func mustOpenInternal(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
