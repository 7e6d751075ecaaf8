package llm_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/llm/offload"
)

// The conformance suite: every engine gives the same replies
// through the same decode loop. The current engine's libraries are
// installed by `make setup` (lib/llama-current); PARLEY_ENGINE_LIB points
// elsewhere; PARLEY_SKIP_CURRENT_ENGINE=1 runs the embedded engine only (a
// platform the prebuilt libraries do not cover).

func currentLibDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("PARLEY_ENGINE_LIB"); d != "" {
		return d
	}
	wd, _ := os.Getwd()
	root, ok := repo.Root(wd)
	if !ok {
		t.Fatal("no repository root above the test")
	}
	return filepath.Join(root, "lib", "llama-current")
}

// engines returns the engines to check, each opened on path with cfg.
func engines(t *testing.T, path string, cfg llm.Config) map[string]*llm.Engine {
	t.Helper()
	out := map[string]*llm.Engine{}
	names := []string{llm.EngineEmbedded, llm.EngineCurrent}
	if os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") == "1" {
		names = names[:1]
	}
	for _, name := range names {
		c := cfg
		c.Path, c.Engine, c.LibDir = path, name, currentLibDir(t)
		e, err := llm.Open(c)
		if err != nil {
			t.Fatalf("engine %s: %v (make setup installs the current engine; PARLEY_SKIP_CURRENT_ENGINE=1 skips it)", name, err)
		}
		t.Cleanup(func() { e.Close() })
		if e.EngineName() != name {
			t.Fatalf("asked for %s, got %s", name, e.EngineName())
		}
		out[name] = e
	}
	return out
}

// synthModel writes a small synthetic llama (tools/mkgguf) with the test
// model's vocabulary: a second architecture shape for the suite.
func synthModel(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "synth.gguf")
	wd, _ := os.Getwd()
	root, _ := repo.Root(wd)
	cmd := exec.Command("go", "run", "./tools/mkgguf", "-o", out, "-vocab", testmodel.Path(t),
		"-layers", "2", "-dim", "128", "-heads", "4", "-kv-heads", "2", "-ffn", "256")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkgguf: %v\n%s", err, b)
	}
	return out
}

func TestConformanceGreedyAndLogprobs(t *testing.T) {
	prompts := []string{"Once upon a time", "The little dog", "Lily and Tom went to the park. They"}
	for _, model := range []string{testmodel.Path(t), synthModel(t)} {
		es := engines(t, model, llm.Config{Threads: 1, Parallel: 3, ContextLength: 256})
		type reply struct {
			ids []int
			lps []float64
		}
		got := map[string][]reply{}
		for name, e := range es {
			// All three at once: the batch holds several sequences.
			chans := make([]<-chan parley.Event, len(prompts))
			for i, p := range prompts {
				toks, err := e.Tokenize(p)
				if err != nil {
					t.Fatal(err)
				}
				if chans[i], err = e.Generate(context.Background(), parley.GenerateRequest{Key: p, Tokens: toks, Params: greedy(32)}); err != nil {
					t.Fatal(err)
				}
			}
			for i, ch := range chans {
				var r reply
				for ev := range ch {
					if ev.Done {
						if ev.Err != nil {
							t.Fatalf("%s: %s: %v", name, prompts[i], ev.Err)
						}
						continue
					}
					r.ids = append(r.ids, ev.Token.ID)
					r.lps = append(r.lps, ev.Token.Logprob)
					if math.IsNaN(ev.Token.Logprob) || ev.Token.Logprob > 0 {
						t.Errorf("%s: logprob %v", name, ev.Token.Logprob)
					}
				}
				if len(r.ids) == 0 {
					t.Fatalf("%s: %s: no tokens", name, prompts[i])
				}
				t.Logf("%s %s %q: %v", filepath.Base(model), name, prompts[i], r.ids)
				got[name] = append(got[name], r)
			}
		}
		if len(es) < 2 {
			continue
		}
		for i := range prompts {
			a, b := got[llm.EngineEmbedded][i], got[llm.EngineCurrent][i]
			if !slices.Equal(a.ids, b.ids) {
				t.Errorf("%s: %q: embedded %v, current %v", filepath.Base(model), prompts[i], a.ids, b.ids)
				continue
			}
			for j := range a.lps {
				if math.Abs(a.lps[j]-b.lps[j]) > 0.05 {
					t.Errorf("%s: %q token %d: logprob %v vs %v", filepath.Base(model), prompts[i], j, a.lps[j], b.lps[j])
				}
			}
		}
	}
}

// TestConformancePenalties: greedy replies under repetition, frequency and
// presence penalties over a short window are the same on both engines (each
// generated token counted once in the window, as llama.cpp's penalties
// sampler counts it), and differ from the unpenalized reply.
func TestConformancePenalties(t *testing.T) {
	es := engines(t, testmodel.Path(t), llm.Config{Threads: 1, Parallel: 1, ContextLength: 256})
	if len(es) < 2 {
		t.Skip("one engine")
	}
	cases := map[string]func(*parley.Params){
		"none":      func(*parley.Params) {},
		"repeat":    func(p *parley.Params) { p.RepeatPenalty, p.RepeatLastN = 1.5, 12 },
		"frequency": func(p *parley.Params) { p.FrequencyPenalty, p.RepeatLastN = 1.5, 24 },
		"presence":  func(p *parley.Params) { p.PresencePenalty, p.RepeatLastN = 2, 6 },
	}
	replies := map[string]map[string][]int{}
	for name, e := range es {
		replies[name] = map[string][]int{}
		for c, set := range cases {
			p := greedy(96)
			set(&p)
			r := generate(t, e, "", "Once upon a time", p)
			if r.final.Err != nil {
				t.Fatalf("%s %s: %v", name, c, r.final.Err)
			}
			replies[name][c] = r.ids
		}
	}
	for c := range cases {
		a, b := replies[llm.EngineEmbedded][c], replies[llm.EngineCurrent][c]
		if !slices.Equal(a, b) {
			t.Errorf("%s penalty: embedded %v\ncurrent %v", c, a, b)
		}
		if c != "none" && slices.Equal(a, replies[llm.EngineEmbedded]["none"]) {
			t.Errorf("%s penalty changed nothing: %v", c, a)
		}
	}
}

func TestConformanceGrammarSchemaAndHostile(t *testing.T) {
	es := engines(t, testmodel.Path(t), llm.Config{Threads: 1, Parallel: 2, ContextLength: 256, StepBudget: 2 * time.Second})
	schema := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["n","ok"]}`)
	var texts []string
	for name, e := range es {
		p := greedy(64)
		p.JSONSchema = schema
		if err := p.Validate(0); err != nil {
			t.Fatal(err)
		}
		r := generate(t, e, "schema", "Once upon a time", p)
		if r.final.Err != nil {
			t.Fatalf("%s: %v", name, r.final.Err)
		}
		var v struct {
			N  *int  `json:"n"`
			OK *bool `json:"ok"`
		}
		if r.final.Finish == parley.FinishEOS {
			if err := json.Unmarshal([]byte(r.text), &v); err != nil || v.N == nil || v.OK == nil {
				t.Errorf("%s: %q does not match the schema: %v", name, r.text, err)
			}
		} else if !strings.HasPrefix(r.text, "{") {
			t.Errorf("%s: %q does not start the object", name, r.text)
		}
		texts = append(texts, r.text)

		g := greedy(16)
		g.Grammar = `root ::= ("yes" | "no") " " [a-z]+`
		if err := g.Validate(0); err != nil {
			t.Fatal(err)
		}
		r = generate(t, e, "grammar", "Once upon a time", g)
		if r.final.Err != nil || !(strings.HasPrefix(r.text, "yes ") || strings.HasPrefix(r.text, "no ")) {
			t.Errorf("%s: grammar reply %q, %v", name, r.text, r.final.Err)
		}

		// Hostile: left recursion is refused with a 400-class error and
		// the engine goes on serving.
		h := greedy(8)
		h.Grammar = "root ::= root \"a\""
		toks, _ := e.Tokenize("x")
		if _, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Params: h}); err == nil {
			t.Errorf("%s: a left-recursive grammar was accepted", name)
		}
		if r := generate(t, e, "after", "Once upon a time", greedy(4)); r.final.Err != nil {
			t.Errorf("%s: after a hostile grammar: %v", name, r.final.Err)
		}
	}
	if len(texts) == 2 && texts[0] != texts[1] {
		t.Errorf("schema replies differ: %q vs %q", texts[0], texts[1])
	}
}

func TestConformanceCancelAndKVReuse(t *testing.T) {
	es := engines(t, testmodel.Path(t), llm.Config{Threads: 1, Parallel: 2, ContextLength: 512})
	for name, e := range es {
		// Cancel: the stream ends cancelled, promptly.
		ctx, cancel := context.WithCancel(context.Background())
		toks, _ := e.Tokenize("Once upon a time")
		ch, err := e.Generate(ctx, parley.GenerateRequest{Key: "c", Tokens: toks, Params: greedy(400)})
		if err != nil {
			t.Fatal(err)
		}
		<-ch
		cancel()
		var final parley.Event
		deadline := time.After(time.Minute) // catches a hang only
	drain:
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					break drain
				}
				final = ev
			case <-deadline:
				t.Fatalf("%s: cancel did not end the stream", name)
			}
		}
		if final.Finish != parley.FinishCancelled {
			t.Errorf("%s: cancelled stream finished %s", name, final.Finish)
		}

		// KV reuse: a second turn that extends the first reuses its cells
		// and replies as a fresh evaluation of the whole prompt would.
		first := generate(t, e, "conv", "Once upon a time", greedy(16))
		turn1, _ := e.Tokenize("Once upon a time")
		turn2 := append(append(turn1, first.ids...), must(e.TokenizeContinuation(" The end. Then"))...)
		ch, err = e.Generate(context.Background(), parley.GenerateRequest{Key: "conv", Tokens: turn2, Params: greedy(16)})
		if err != nil {
			t.Fatal(err)
		}
		second := collect(t, ch)
		if second.final.Usage.CachedPromptTokens < len(turn1) {
			t.Errorf("%s: second turn reused %d tokens, want at least %d", name, second.final.Usage.CachedPromptTokens, len(turn1))
		}
		ch, err = e.Generate(context.Background(), parley.GenerateRequest{Key: "fresh", Tokens: turn2, Params: greedy(16)})
		if err != nil {
			t.Fatal(err)
		}
		if fresh := collect(t, ch); !slices.Equal(fresh.ids, second.ids) {
			t.Errorf("%s: reused %v, fresh %v", name, second.ids, fresh.ids)
		}
	}
}

func must(toks []int, err error) []int {
	if err != nil {
		panic(err)
	}
	return toks
}

// TestEngineAuto: auto takes the current engine when its libraries load,
// the embedded one (with one log line) when they do not; an unknown engine
// name is refused. GPU layers asked for (bin/parley's default --gpu-layers
// auto) keep the current engine when the embedded build finds no GPU, as
// on these machines (TestDeviceWithoutGPU).
func TestEngineAuto(t *testing.T) {
	if os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") != "1" {
		e := mustOpen(t, llm.Config{Engine: llm.EngineAuto, LibDir: currentLibDir(t), Parallel: 1, ContextLength: 128})
		if e.EngineName() != llm.EngineCurrent {
			t.Errorf("auto with the libraries: %s", e.EngineName())
		}
		e = mustOpen(t, llm.Config{Engine: llm.EngineAuto, LibDir: currentLibDir(t), Parallel: 1, ContextLength: 128, GPULayers: offload.Auto})
		if e.EngineName() != llm.EngineCurrent {
			t.Errorf("auto with the libraries, GPU layers asked for and no GPU: %s", e.EngineName())
		}
		// F16 weights go to the embedded engine when the folder holds the
		// prebuilt CPU variants (whose prompt evaluation of them is the
		// slower one), to the current engine when it holds the CPU backend
		// make setup compiles; a quantized copy of the same model to the
		// current engine either way.
		spec := synth.DefaultSpec()
		spec.VocabFrom = testmodel.Path(t)
		spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN = 2, 64, 2, 1, 128
		f16 := filepath.Join(t.TempDir(), "auto-f16.gguf")
		if _, err := synth.Write(context.Background(), f16, spec); err != nil {
			t.Fatal(err)
		}
		q8 := filepath.Join(t.TempDir(), "auto-q8_0.gguf")
		if err := llm.Quantize(f16, q8, "q8_0", 1); err != nil {
			t.Fatal(err)
		}
		f16Engine := llm.EngineEmbedded
		if _, err := os.Stat(filepath.Join(currentLibDir(t), "libggml-cpu.so")); err == nil {
			f16Engine = llm.EngineCurrent
		}
		for path, want := range map[string]string{f16: f16Engine, q8: llm.EngineCurrent} {
			e = mustOpen(t, llm.Config{Path: path, Engine: llm.EngineAuto, LibDir: currentLibDir(t), Parallel: 1, ContextLength: 128})
			if e.EngineName() != want {
				t.Errorf("auto on %s (%s): %s, want %s", filepath.Base(path), e.Info().Quantization, e.EngineName(), want)
			}
		}
	}
	e := mustOpen(t, llm.Config{Engine: llm.EngineAuto, LibDir: t.TempDir(), Parallel: 1, ContextLength: 128})
	if e.EngineName() != llm.EngineEmbedded {
		t.Errorf("auto without libraries: %s", e.EngineName())
	}
	if _, err := llm.Open(llm.Config{Path: testmodel.Path(t), Engine: "newest"}); err == nil || !strings.Contains(err.Error(), "engine") {
		t.Errorf("engine newest: %v", err)
	}
}

// TestConformanceTokenize: both engines tokenize the same texts to the same
// tokens, NUL bytes, invalid UTF-8 and special-token text included.
func TestConformanceTokenize(t *testing.T) {
	es := engines(t, testmodel.Path(t), llm.Config{Threads: 1, Parallel: 1, ContextLength: 128})
	texts := []string{"", "Once upon a time", "a\x00b\x00", "\xff\xfe bad utf-8", "<s> x </s>", strings.Repeat("la ", 200)}
	for _, text := range texts {
		var got [][]int
		for name, e := range es {
			toks, err := e.Tokenize(text)
			if err != nil {
				t.Fatalf("%s: %q: %v", name, text, err)
			}
			got = append(got, toks)
		}
		if len(got) == 2 && !slices.Equal(got[0], got[1]) {
			t.Errorf("%q: %v vs %v", text, got[0], got[1])
		}
	}
}
