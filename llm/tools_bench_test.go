package llm_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// TestToolCallCost measures the per-token decode cost of a constrained tool
// call against free text on the synthetic SmolLM2-135M model (docs/notes/2026-11-25-tool-calls.md). It runs only with PARLEY_TOOL_BENCH=1; it writes the 204 MiB
// model to PARLEY_BENCH_MODEL when that file does not exist yet (to a
// temporary folder when it is not set). All three replies share one
// prompt (the tool prompt): tool_choice none (free text), auto (free text
// under a lazy grammar that never triggers) and required (the call grammar
// from the first token).
func TestToolCallCost(t *testing.T) {
	if os.Getenv("PARLEY_TOOL_BENCH") != "1" {
		t.Skip("set PARLEY_TOOL_BENCH=1 to measure")
	}
	path := os.Getenv("PARLEY_BENCH_MODEL")
	if _, err := os.Stat(path); path == "" || err != nil {
		spec := synth.DefaultSpec()
		spec.VocabFrom = testmodel.Path(t)
		if path == "" {
			path = filepath.Join(t.TempDir(), "smollm2-135m.gguf")
		}
		if _, err := synth.Write(context.Background(), path, spec); err != nil {
			t.Fatal(err)
		}
	}
	measureToolCost(t, path, 48)
	measureToolCost(t, testmodel.Path(t), 200)
}

// measureToolCost runs the three replies to one tool prompt on the model at
// path, interleaved over 3 rounds, and logs the median cost of a token:
// wall time, and the process's CPU time (user + system), which a machine
// shared with other jobs disturbs far less. One llama.cpp thread, so no
// thread spins waiting for another.
func measureToolCost(t *testing.T, path string, maxTokens int) {
	e := mustOpen(t, llm.Config{Path: path, ContextLength: 2048, Parallel: 1, Threads: 1})
	tools := []parley.Tool{{Name: "set_alarm", Parameters: json.RawMessage(
		`{"type":"object","properties":{"hour":{"type":"integer","minimum":0,"maximum":23},"label":{"type":"string","maxLength":400},` +
			`"days":{"type":"array","items":{"enum":["mon","tue","wed","thu","fri"]},"maxItems":5}},"required":["hour","label","days"],"additionalProperties":false}`)}}
	tmpl := chat.NewResponder(e).Template()
	prompt, err := tmpl.Render([]parley.Message{{Role: parley.RoleUser, Content: "Wake me at seven."}},
		chat.RenderOptions{AddGenerationPrompt: true, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := e.Tokenize(prompt)
	if err != nil {
		t.Fatal(err)
	}
	// One prompt for all three: the per-token cost differs by the sampling only.
	params := func(choice string) parley.Params {
		p := greedy(maxTokens)
		if choice != "" {
			p.Tools, p.ToolChoice, p.ToolSyntax = tools, parley.ToolChoice{Mode: choice}, chat.ToolSyntaxOf(tmpl)
		}
		return p
	}
	cases := []struct{ name, choice string }{
		{"free text (no tools)", ""},
		{"free text under auto's lazy grammar", parley.ToolAuto},
		{"constrained call (required)", parley.ToolRequired},
	}
	rates := make([][]time.Duration, len(cases))
	cpus := make([][]time.Duration, len(cases))
	counts := make([]int, len(cases))
	for round := range 3 { // interleaved, so that a busy moment hurts all three alike
		for i, c := range cases {
			cpu0 := cpuTime()
			ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: "bench", Tokens: tokens, Params: params(c.choice)})
			if err != nil {
				t.Fatal(err)
			}
			r := collect(t, ch)
			if r.final.Err != nil {
				t.Fatal(r.final.Err)
			}
			n := r.final.Usage.CompletionTokens
			cpu := (cpuTime() - cpu0) / time.Duration(n)
			cpus[i] = append(cpus[i], cpu)
			gen := r.final.Timings.Total - r.final.Timings.TimeToFirstToken
			rates[i] = append(rates[i], gen/time.Duration(n-1))
			counts[i] = n
			t.Logf("round %d, %s: %d tokens, %s a token, CPU %s a token (prompt %d, %d cached): %q", round, c.name, n, gen/time.Duration(n-1), cpu,
				r.final.Usage.PromptTokens, r.final.Usage.CachedPromptTokens, r.text)
		}
	}
	med := func(d []time.Duration) float64 {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return ms(d[len(d)/2])
	}
	base, cbase := med(rates[0]), med(cpus[0])
	t.Logf("%s, prompt %d tokens", filepath.Base(path), len(tokens))
	t.Logf("| reply | tokens | wall ms/token | vs free text | CPU ms/token | vs free text |")
	for i, c := range cases {
		m, cm := med(rates[i]), med(cpus[i])
		t.Logf("| %s | %d | %.3f | %+.1f%% | %.3f | %+.1f%% |", c.name, counts[i], m, 100*(m/base-1), cm, 100*(cm/cbase-1))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
