package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// freezeBudget is the step budget of the engines in these tests: short, so
// that the family runs in seconds.
const freezeBudget = 300 * time.Millisecond

// stallSlack is how far past the step budget a refused or ended request may
// end, and a normal reply beside it may run past its time alone: a second,
// more under the race detector (raceSlack), beside the baselines each check
// measures on the same machine at the same moment (a busy machine
// ran the Go side of one refusal for seven seconds).
const stallSlack = raceSlack * time.Second

// goSide measures the Go side of a request with p (Params.Validate: the
// grammar's static cost check, the witness search that confirms a
// refusal), the work that runs before the step budget applies. It is
// bounded CPU work that runs as slowly as the machine does, so a bound on
// a request is "the step budget, plus this, plus slack", measured again
// for every check: a freeze inside llama.cpp is seconds to minutes a token
// past all of it.
func goSide(p parley.Params) time.Duration {
	start := time.Now()
	p.Validate(0) // a copy: the request itself is validated by Generate
	return time.Since(start)
}

// stallBound is how long a request with p may take to be refused or to
// end: the step budget, its Go side three times over (measured now, on
// this machine), and the slack.
func stallBound(p parley.Params) time.Duration {
	return freezeBudget + 3*goSide(p) + stallSlack
}

// costly is one member of the family of grammars and schemas that made
// each token cost seconds inside llama.cpp.
type costly struct {
	name    string
	grammar string
	schema  string
}

// costlyFamily generates the family: nested repetitions of several depths
// and bounds over overlapping characters, alternations, rules that
// reference rules, * and + inside bounded repetitions, schema patterns that
// convert to such grammars, and nested maxLength/maxItems.
func costlyFamily() []costly {
	var fam []costly
	add := func(name, g string) { fam = append(fam, costly{name: name, grammar: g}) }
	addSchema := func(name, s string) { fam = append(fam, costly{name: name, schema: s}) }
	for _, cls := range []string{"[a-z ]", "[a-z]", "[^0-9]"} {
		for _, b := range [][2]int{{1000, 500}, {100, 100}, {30, 30}, {10, 10}, {4, 4}} {
			add(fmt.Sprintf("%s{0,%d}{0,%d}", cls, b[0], b[1]), fmt.Sprintf("root ::= (%s{0,%d}){0,%d}", cls, b[0], b[1]))
		}
		add(cls+" depth 3", fmt.Sprintf("root ::= ((%s{0,8}){0,8}){0,8}", cls))
		add(cls+" depth 4", fmt.Sprintf("root ::= (((%s{0,5}){0,5}){0,5}){0,5}", cls))
	}
	for _, n := range []int{20, 200} {
		add(fmt.Sprintf("alternation %d", n), fmt.Sprintf("root ::= ([a-m]{0,%d} | [h-z]{0,%d}){0,%d}", n, n, n))
		add(fmt.Sprintf("rules referencing rules %d", n), fmt.Sprintf("root ::= word{0,%d}\nword ::= letter{0,%d}\nletter ::= [a-z] | [A-Z] | \" \"", n, n))
		add(fmt.Sprintf("plus inside bounded %d", n), fmt.Sprintf(`root ::= ([a-z]+ " "?){0,%d}`, n))
		add(fmt.Sprintf("star inside bounded %d", n), fmt.Sprintf(`root ::= ("a" [a-z]*){0,%d}`, n))
		add(fmt.Sprintf("overlapping delimiter %d", n), fmt.Sprintf(`root ::= ("x" [a-z]{0,%d}){0,%d}`, n, n))
		addSchema(fmt.Sprintf("pattern %d", n), fmt.Sprintf(`{"type":"string","pattern":"^([a-z]{0,%d}){0,%d}$"}`, n, n))
		addSchema(fmt.Sprintf("pattern plus %d", n), fmt.Sprintf(`{"type":"string","pattern":"^([a-z]+ ?){0,%d}$"}`, n))
		addSchema(fmt.Sprintf("nested maxItems/maxLength %d", n), fmt.Sprintf(
			`{"type":"array","items":{"type":"array","items":{"type":"string","maxLength":%d},"maxItems":%d},"maxItems":%d}`, n, n, n))
		addSchema(fmt.Sprintf("object of nested arrays %d", n), fmt.Sprintf(
			`{"type":"object","properties":{"a":{"type":"array","items":{"type":"string","pattern":"^[a-z]{0,%d}$"},"maxItems":%d}},"required":["a"]}`, n, n))
	}
	return fam
}

// ends runs one request (its Generate call and its whole stream) and
// returns how long it took and its error, if any.
func ends(e *llm.Engine, ctx context.Context, toks []int, p parley.Params) (time.Duration, error) {
	start := time.Now()
	ch, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: p})
	if err != nil {
		return time.Since(start), err
	}
	var final parley.Event
	for ev := range ch {
		if ev.Done {
			final = ev
		}
	}
	return time.Since(start), final.Err
}

// TestCostlyGrammarsNeverStall: every member of the family is refused, or
// ends, within the step budget plus its Go side plus a second
// (stallBound), and a normal reply started beside it finishes within a
// second of twice its time alone, measured just before. Errors name the
// grammar (400-class), never "internal".
func TestCostlyGrammarsNeverStall(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 2, Threads: 1, StepBudget: freezeBudget,
		MaxOverrunsPerClient: 64, MaxOverruns: 64})
	toks, _ := e.Tokenize("Once upon a time")
	normal := greedy(8)
	var slowest time.Duration
	var slowestName string
	var worstBeside, worstAlone time.Duration
	for _, c := range costlyFamily() {
		// Two tokens: the budget holds per token (and for the admission
		// probe), so a request of many tokens each just under it may take
		// longer than one budget in all.
		p := greedy(2)
		p.Temperature, p.Seed = 1, 3
		p.Grammar, p.JSONSchema = c.grammar, json.RawMessage(c.schema)
		// The baselines, on this machine now: the normal reply alone and
		// the hostile request's Go side.
		alone, err := ends(e, context.Background(), toks, normal)
		if err != nil {
			t.Fatal(err)
		}
		bound := stallBound(p)
		var wg sync.WaitGroup
		var took time.Duration
		var herr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, herr = ends(e, context.Background(), toks, p)
		}()
		beside, err := ends(e, context.Background(), toks, normal)
		wg.Wait()
		if err != nil {
			t.Errorf("%s: the normal reply beside it failed: %v", c.name, err)
		}
		if took > bound {
			t.Errorf("%s: took %s to end, over the step budget (%s), its Go side and slack (%s)", c.name, took, freezeBudget, bound)
		}
		if beside > 2*alone+stallSlack {
			t.Errorf("%s: a normal reply beside it took %s (%s alone)", c.name, beside, alone)
		}
		if herr != nil {
			var pe *parley.Error
			if !errors.As(herr, &pe) || pe.Code == parley.EInternal {
				t.Errorf("%s: want an error that names the grammar, got %v", c.name, herr)
			}
		}
		if took > slowest {
			slowest, slowestName = took, c.name
		}
		worstBeside, worstAlone = max(worstBeside, beside), max(worstAlone, alone)
		t.Logf("%-40s %8s %v", c.name, took.Round(time.Millisecond), herr)
	}
	t.Logf("slowest hostile request: %s (%s); normal reply alone at most %s, beside one at most %s",
		slowest.Round(time.Millisecond), slowestName, worstAlone.Round(time.Millisecond), worstBeside.Round(time.Millisecond))
}

// TestOverrunEndsOnlyItsSequence: under a step budget too short for most
// grammar samples, grammar-constrained requests (the family's admitted members and
// ordinary grammars) end at the budget with an error that names the
// grammar, at admission or mid-reply, while unconstrained replies beside
// them, sampled inline, finish as usual.
func TestOverrunEndsOnlyItsSequence(t *testing.T) {
	const budget = 200 * time.Microsecond
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 2, Threads: 1, StepBudget: budget,
		MaxOverrunsPerClient: 64, MaxOverruns: 64})
	toks, _ := e.Tokenize("Once upon a time")
	grammars := []string{`root ::= ([a-z]+ " "){0,50}`, `root ::= ("a" [a-z]*){0,20}`, `root ::= [a-z ]{0,200}`, jsonGrammarForFuzz}
	ended := 0
	for _, g := range grammars {
		p := greedy(32)
		p.Grammar = g
		bound := stallBound(p) - freezeBudget + budget
		var wg sync.WaitGroup
		var took time.Duration
		var herr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, herr = ends(e, context.Background(), toks, p)
		}()
		// The unconstrained reply is over this budget too (inline samples
		// are checked after the fact); it must end, not wait.
		ch, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: greedy(8)})
		if err != nil {
			t.Fatal(err)
		}
		collect(t, ch)
		wg.Wait()
		var pe *parley.Error
		// A sample that fits in the budget (a fast machine, a short token)
		// goes on; one that does not ends the request.
		if herr != nil && (!errors.As(herr, &pe) || pe.Code != parley.EInvalid || !strings.Contains(pe.Message, "too costly")) {
			t.Errorf("%s: want a too-costly grammar error, got %v", g, herr)
		}
		if took > bound {
			t.Errorf("%s: took %s to end (bound %s)", g, took, bound)
		}
		if herr != nil && strings.Contains(herr.Error(), "the reply was ended") {
			ended++
		}
	}
	t.Logf("%d of %d ended mid-reply (the others at admission, or finished within the budget)", ended, len(grammars))

	if ended > 0 && e.Stats().OverBudget == 0 {
		t.Fatal("OverBudget not counted")
	}
	waitNoOverruns(t, e)
}

// TestOverrunningSamplersAreCapped: a grammar sampler that overruns the
// step budget is abandoned (its C call cannot be stopped) and counted
// against its client until llama.cpp returns; while the client is at its
// cap, its grammar requests are refused with a rate-limit error naming the
// reason, and another client's are not.
func TestOverrunningSamplersAreCapped(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 2, Threads: 1, StepBudget: time.Microsecond,
		MaxOverrunsPerClient: 1, MaxOverruns: 8})
	toks, _ := e.Tokenize("Once upon a time")
	p := greedy(4)
	// Admitted by the static bound, but no grammar is matched in a microsecond.
	p.Grammar = `root ::= ([a-z]+ " "){0,50}`
	a := context.Background()
	for range 20 { // until the probe's C call is caught still running
		_, err := e.Generate(a, parley.GenerateRequest{Tokens: toks, Params: p, Client: "a"})
		var pe *parley.Error
		if !errors.As(err, &pe) || pe.Code != parley.EInvalid || !strings.Contains(pe.Message, "too costly") {
			t.Fatalf("want a too-costly refusal, got %v", err)
		}
		_, err = e.Generate(a, parley.GenerateRequest{Tokens: toks, Params: p, Client: "a"})
		if errors.As(err, &pe) && pe.Code == parley.ERateLimited {
			if !strings.Contains(pe.Message, "past the step budget") {
				t.Fatalf("the refusal does not say why: %v", err)
			}
			// Another client is not held by a's overruns.
			_, err = e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: p, Client: "b"})
			if errors.As(err, &pe) && pe.Code == parley.ERateLimited {
				t.Fatalf("client b refused for client a's overruns: %v", err)
			}
			// An unconstrained request is never refused for them (it
			// ends over this engine's budget, but it is admitted).
			ch, err := e.Generate(a, parley.GenerateRequest{Tokens: toks, Params: greedy(4), Client: "a"})
			if err != nil {
				t.Fatalf("unconstrained request refused: %v", err)
			}
			collect(t, ch)
			waitNoOverruns(t, e)
			return
		}
		waitNoOverruns(t, e)
	}
	t.Skip("the abandoned sampler always returned before the next request: the machine is too fast for this check")
}

func waitNoOverruns(t *testing.T, e *llm.Engine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.Stats().SamplersOverrunning > 0 {
		if time.Now().After(deadline) {
			t.Fatal("abandoned samplers still running after 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGrammarSequencesGenerate: a grammar-constrained reply sampled off the
// loop matches its grammar and is reproducible under a seed.
func TestGrammarSequencesGenerate(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 2})
	p := greedy(12)
	p.Grammar = `root ::= ("yes" | "no") " " [a-z]{1,8}`
	r := generate(t, e, "", "Once upon a time", p)
	if r.final.Err != nil {
		t.Fatal(r.final.Err)
	}
	if !(strings.HasPrefix(r.text, "yes ") || strings.HasPrefix(r.text, "no ")) {
		t.Fatalf("reply %q does not match the grammar", r.text)
	}
	p.Temperature, p.Seed = 1, 42
	a := generate(t, e, "", "Once upon a time", p)
	b := generate(t, e, "", "Once upon a time", p)
	if a.text != b.text {
		t.Fatalf("same seed, different replies: %q and %q", a.text, b.text)
	}
}

// FuzzGrammarNeverStalls: whatever the grammar, its request is refused or
// ends within the step budget plus its Go side plus a second (stallBound),
// and the engine still answers a normal prompt within a second of twice
// its time alone, measured just before (both baselines on this machine at
// this moment, so that a busy machine does not fail it).
func FuzzGrammarNeverStalls(f *testing.F) {
	for _, c := range costlyFamily() {
		if c.grammar != "" {
			f.Add(c.grammar)
		}
	}
	f.Add(`root ::= "yes" | "no"`)
	f.Add(jsonGrammarForFuzz)
	e := mustOpen(f, llm.Config{ContextLength: 128, Parallel: 2, Threads: 1, StepBudget: freezeBudget})
	toks, _ := e.Tokenize("Once")
	f.Fuzz(func(t *testing.T, g string) {
		alone, err := ends(e, context.Background(), toks, greedy(4))
		if err != nil {
			t.Fatal(err)
		}
		p := greedy(2) // see TestCostlyGrammarsNeverStall
		p.Grammar = g
		bound := stallBound(p)
		took, herr := ends(e, context.Background(), toks, p)
		if took > bound {
			t.Fatalf("took %s to end, over %s (%v)", took, bound, herr)
		}
		var pe *parley.Error
		if herr != nil && errors.As(herr, &pe) && pe.Code == parley.EInternal {
			t.Fatalf("internal error for a grammar: %v", herr)
		}
		if d, err := ends(e, context.Background(), toks, greedy(4)); err != nil || d > 2*alone+stallSlack {
			t.Fatalf("a normal reply after it: %s (%s alone), %v", d, alone, err)
		}
	})
}

const jsonGrammarForFuzz = `root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\] | "\\" ["\\bfnrt] )* "\"" ws
number ::= "-"? [0-9]+ ws
ws ::= | " "
`
