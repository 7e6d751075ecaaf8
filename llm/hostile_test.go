package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// TestGrammarDeadEndEndsTheSequence: a grammar that allows a first token but
// then none (here a token id outside the vocabulary) ends its sequence with
// an error instead of reaching llama.cpp's aborting sampler; the engine then
// answers a normal prompt.
func TestGrammarDeadEndEndsTheSequence(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	for _, g := range []string{
		`root ::= "a" <[99999]>`,
		`root ::= [a-z] <[99999]>`,
	} {
		p := greedy(8)
		p.Grammar = g
		r := generate(t, e, "", "Once upon a time", p)
		if r.final.Finish != parley.FinishError || r.final.Err == nil || !strings.Contains(r.final.Err.Error(), "allows no token") {
			t.Fatalf("%s: want a grammar dead-end error, got %+v", g, r.final)
		}
	}
	if got := e.Stats().GrammarDeadEnds; got != 2 {
		t.Fatalf("GrammarDeadEnds = %d, want 2", got)
	}
	r := generate(t, e, "", "Once upon a time", greedy(8))
	if r.final.Finish != parley.FinishLength || r.text == "" {
		t.Fatalf("normal prompt after the dead ends: %+v %q", r.final, r.text)
	}
}

// TestHostileGrammarsRefused: each class of grammar and schema that killed,
// froze or exhausted the process is refused before llama.cpp, naming the
// field, and the engine answers a normal prompt after.
func TestHostileGrammarsRefused(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	nested := "root ::= a0\n"
	for i := range 30 {
		nested += "a" + itoa(i) + ` ::= ("x" | "") a` + itoa(i+1) + " a" + itoa(i+1) + "\n"
	}
	nested += "a30 ::= \"y\" | \"\"\n"
	cases := []struct {
		name, grammar, schema, field string
	}{
		{"empty class", `root ::= "a" []`, "", "grammar"},
		{"negated everything", `root ::= "a" [^\x00-\U0010FFFF]`, "", "grammar"},
		{"max below min", `root ::= "a"{5,2}`, "", "grammar"},
		{"huge bound", `root ::= "a"{0,18446744073709551615}`, "", "grammar"},
		{"nested nullable", nested, "", "grammar"},
		{"length bounds reversed", "", `{"type":"string","minLength":5,"maxLength":2}`, "json_schema"},
		{"items bounds reversed", "", `{"type":"array","minItems":3,"maxItems":1}`, "json_schema"},
		{"no integer", "", `{"type":"integer","exclusiveMinimum":10,"exclusiveMaximum":11}`, "json_schema"},
		{"reversed integer range", "", `{"type":"integer","minimum":19,"maximum":12}`, "json_schema"},
		{"lookahead", "", `{"type":"string","pattern":"^(?=a)a$"}`, "json_schema"},
		{"posix class", "", `{"type":"string","pattern":"^[[:alpha:]]+$"}`, "json_schema"},
	}
	for _, c := range cases {
		p := greedy(8)
		p.Grammar, p.JSONSchema = c.grammar, json.RawMessage(c.schema)
		toks, _ := e.Tokenize("Once")
		_, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: p})
		var pe *parley.Error
		if !errors.As(err, &pe) || pe.Code != parley.EInvalid || pe.Field != c.field {
			t.Errorf("%s: want an invalid %s error, got %v", c.name, c.field, err)
		}
	}
	r := generate(t, e, "", "Once upon a time", greedy(8))
	if r.final.Finish != parley.FinishLength || r.text == "" {
		t.Fatalf("normal prompt after the hostile ones: %+v", r.final)
	}
}

// TestSchemaGrammarsStillWork: ordinary schemas pass the checks on their
// converted grammar and constrain the output.
func TestSchemaGrammarsStillWork(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	for _, s := range []string{
		`{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["name","age"]}`,
		`{"type":"integer","minimum":10,"maximum":99}`,
		`{"type":"string","pattern":"^[a-z]{1,8}$"}`,
		`{"enum":["red","green","blue"]}`,
		`{"type":"object","properties":{"a":{"type":"string","maxLength":2000},"b":{"type":"string","minLength":5,"maxLength":1500},"c":{"type":"array","items":{"type":"string","maxLength":2000},"maxItems":100}}}`,
		// Items that share a first character (the quote of every optional
		// property's name) are not mistaken for costly repetitions.
		optionalProperties(60),
		`{"oneOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"type":"object","properties":{"b":{"type":"string"}},"required":["b"]}]}`,
		`{"type":"array","items":{"type":"object","properties":{"name":{"type":"string","maxLength":50},"tags":{"type":"array","items":{"type":"string","maxLength":20},"maxItems":10}},"required":["name"]},"maxItems":50}`,
		`{"type":"string","format":"date-time"}`,
	} {
		p := greedy(40)
		p.JSONSchema = json.RawMessage(s)
		r := generate(t, e, "", "Once upon a time", p)
		if r.final.Err != nil {
			t.Errorf("%s: %v", s, r.final.Err)
		}
	}
}

// optionalProperties is an object schema of n optional short strings.
func optionalProperties(n int) string {
	var ps []string
	for i := range n {
		ps = append(ps, `"field_`+itoa(i)+`":{"type":"string","maxLength":40}`)
	}
	return `{"type":"object","properties":{` + strings.Join(ps, ",") + `}}`
}

// TestStepBudgetEndsASlowSequence: a sequence whose sampling step takes
// longer than the budget is ended with an error.
func TestStepBudgetEndsASlowSequence(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1, StepBudget: time.Nanosecond})
	r := generate(t, e, "", "Once upon a time", greedy(8))
	if r.final.Finish != parley.FinishError || r.final.Err == nil || !strings.Contains(r.final.Err.Error(), "budget") {
		t.Fatalf("want a step-budget error, got %+v", r.final)
	}
	if e.Stats().OverBudget != 1 {
		t.Fatalf("OverBudget = %d, want 1", e.Stats().OverBudget)
	}
}

// TestShutdownIsBounded: Shutdown returns by its deadline whatever the loop
// is doing, and a later Close still frees the engine.
func TestShutdownIsBounded(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	toks, _ := e.Tokenize("Once upon a time")
	ch, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: greedy(200)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err = e.Shutdown(ctx)
	if err != nil && !errors.Is(err, llm.ErrShutdownTimeout) {
		t.Fatal(err)
	}
	// A timeout only once the deadline has passed; how long past it a busy
	// machine wakes the caller is not checked, only a hang.
	if errors.Is(err, llm.ErrShutdownTimeout) && ctx.Err() == nil {
		t.Fatalf("Shutdown timed out after %s, before its deadline", time.Since(start))
	}
	if took := time.Since(start); took > 5*time.Second+time.Minute {
		t.Fatalf("Shutdown took %s", took)
	}
	done, cancel0 := context.WithCancel(context.Background())
	cancel0()
	_ = e.Shutdown(done) // an expired context returns at once
	collect(t, ch)
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// TestNativeLogIsStructured: with llama.cpp's log routed through zap, every
// line a model load and a refused grammar produce is one JSON entry.
func TestNativeLogIsStructured(t *testing.T) {
	var buf syncBuffer
	llm.SetNativeLog(&buf, true)
	defer llm.SetNativeLog(os.Stderr, false)
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	p := greedy(4)
	p.Grammar = "root ::= \"a\" | [\n{\"level\":\"error\",\"msg\":\"forged\"}\n"
	toks, _ := e.Tokenize("Once")
	if _, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: p}); err == nil {
		t.Fatal("bad grammar accepted")
	}
	out := buf.String()
	if out == "" {
		t.Fatal("no native log at all with verbose on")
	}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("raw line in the log: %q", line)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
