package main

// Tests live in package main (a command cannot be imported by an external
// test package).

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	otemplate "github.com/ollama/ollama/template"
	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/tools/internal/benchmd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{[]float64{5}, 50, 5},
		{[]float64{5}, 95, 5},
		{[]float64{3, 1, 2}, 50, 2},
		{[]float64{1, 2, 3, 4}, 50, 2}, // nearest rank: ceil(0.5*4) = 2nd
		{[]float64{1, 2, 3, 4}, 95, 4},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 95, 100},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 90, 90},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 10, 10},
	}
	for _, tt := range tests {
		if got := percentile(tt.xs, tt.p); got != tt.want {
			t.Errorf("percentile(%v, %g) = %g, want %g", tt.xs, tt.p, got, tt.want)
		}
	}
	if !math.IsNaN(percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
}

func TestSummarizeConv(t *testing.T) {
	turn := func(i int, ttft, decode time.Duration, tokens, prompt, cached int) turnResult {
		return turnResult{Turn: i, TTFT: ttft, Decode: decode, Total: ttft + decode, Tokens: tokens, PromptTokens: prompt, CachedTokens: cached}
	}
	c := concResult{
		Sessions: 2,
		Wall:     2 * time.Second,
		Turns: [][]turnResult{
			{turn(0, 10*time.Millisecond, 630*time.Millisecond, 64, 20, 0), turn(1, 12*time.Millisecond, 630*time.Millisecond, 64, 100, 84)},
			{turn(0, 30*time.Millisecond, 315*time.Millisecond, 64, 21, 0)}, // a session that stopped after one turn
		},
		Errors: []string{"session 1 turn 2: boom"},
	}
	st := summarizeConv(c)
	if st.Turns != 2 || len(st.TTFT50) != 2 {
		t.Fatalf("turns %d, TTFT50 %v", st.Turns, st.TTFT50)
	}
	if st.TTFT50[0] != 10 || st.TTFT95[0] != 30 || st.TTFT50[1] != 12 {
		t.Errorf("TTFT p50 %v p95 %v", st.TTFT50, st.TTFT95)
	}
	if st.Tokens != 192 || st.Aggregate != 96 {
		t.Errorf("tokens %d aggregate %g, want 192 and 96", st.Tokens, st.Aggregate)
	}
	// Rates: 63/0.63 = 100 (twice) and 63/0.315 = 200: median 100.
	if math.Abs(st.StreamRate-100) > 1e-9 {
		t.Errorf("stream rate %g, want 100", st.StreamRate)
	}
	if st.Cached50[1] != 84 || st.Prompt50[1] != 100 {
		t.Errorf("turn 2 prompt %g cached %g", st.Prompt50[1], st.Cached50[1])
	}
	if got := st.lastOverFirst(); math.Abs(got-1.2) > 1e-9 {
		t.Errorf("lastOverFirst %g, want 1.2", got)
	}
	if (turnResult{Tokens: 1, Decode: time.Second}).rate() != 0 {
		t.Error("a one-token reply has a rate")
	}
}

// TestOllamaTemplateMatchesParley renders the same conversations with the
// Modelfile template (through Ollama's own template package) and with
// Parley's plain transcript: the two servers must be given the same prompt
// text, or the comparison is not fair.
func TestOllamaTemplateMatchesParley(t *testing.T) {
	plain, err := chat.TemplateByName(chat.NamePlain)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := otemplate.Parse(ollamaPlainTemplate)
	if err != nil {
		t.Fatal(err)
	}
	u := func(s string) parley.Message { return parley.Message{Role: parley.RoleUser, Content: s} }
	a := func(s string) parley.Message { return parley.Message{Role: parley.RoleAssistant, Content: s} }
	sys := func(s string) parley.Message { return parley.Message{Role: parley.RoleSystem, Content: s} }
	convs := [][]parley.Message{
		{u(promptFor(0, 0))},
		{u(promptFor(1, 0)), a("Once upon a time, Tom had a red ball."), u(promptFor(1, 1))},
		{u("a"), a("b"), u("c"), a("d"), u("e")},
		{sys("Be kind."), u("Hi"), a("Hello."), u("Bye")},
	}
	for _, conv := range convs {
		want, err := plain.Render(conv, chat.Gen)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []api.Message
		for _, m := range conv {
			msgs = append(msgs, api.Message{Role: string(m.Role), Content: m.Content})
		}
		var got bytes.Buffer
		if err := tmpl.Execute(&got, otemplate.Values{Messages: msgs}); err != nil {
			t.Fatal(err)
		}
		if got.String() != want {
			t.Errorf("Ollama renders\n%q\nParley renders\n%q", got.String(), want)
		}
	}
}

func TestModelfile(t *testing.T) {
	mf := modelfile(serverConfig{model: "/m/x.gguf", ctx: 1024, threads: 3})
	for _, want := range []string{"FROM /m/x.gguf\n", `TEMPLATE """{{- range`, "PARAMETER num_ctx 1024\n", "PARAMETER num_thread 3\n", "PARAMETER temperature 0\n"} {
		if !strings.Contains(mf, want) {
			t.Errorf("Modelfile lacks %q:\n%s", want, mf)
		}
	}
}

func TestFilterEnv(t *testing.T) {
	got := filterEnv([]string{"OLLAMA_HOST=x", "HOME=/root", "PATH=/bin", "OLLAMA_MODELS=y", "HOMER=z"}, "OLLAMA_", "HOME=")
	if strings.Join(got, " ") != "PATH=/bin HOMER=z" {
		t.Errorf("filterEnv = %v", got)
	}
}

func TestFlagsRejectBadInput(t *testing.T) {
	model := testmodel.Path(t)
	tests := [][]string{
		{"-models", "/nonexistent.gguf", "-servers", "", "-raw"},
		{"-models", model, "-servers", "vllm"},
		{"-models", model, "-servers", "", "-sessions", "1,x"},
		{"-models", model, "-servers", "", "-stream-tokens", "1"},
		{"-models", model, "-servers", "parley", "-parley", "/nonexistent/parley"},
		{"-models", model, "-servers", "", "-timeout", "0s"},
		{"-models", model, "-servers", "", "-gpu-layers", "all"},
		{"-models", model, "-servers", "", "-gpu-layers", "-1"},
	}
	for _, args := range tests {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

// TestGPUSection: a GPU run (-section gpu) writes a section of its own, so
// the CPU figures stay, and checks the targets.
func TestGPUSection(t *testing.T) {
	cpu, gpu := sectionMarkers(""), sectionMarkers("gpu")
	if cpu.Begin != beginMarker || gpu.Begin == cpu.Begin || gpu.End == cpu.End {
		t.Errorf("markers: cpu %+v, gpu %+v; want the gpu section's own", cpu, gpu)
	}
	if gpuLayers("auto") != -1 || gpuLayers("12") != 12 {
		t.Errorf("gpuLayers: auto -> %d, 12 -> %d", gpuLayers("auto"), gpuLayers("12"))
	}
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	for _, m := range []benchmd.Markers{cpu, gpu, cpu} {
		if err := benchmd.WriteSection(path, m, "figures of "+m.Begin); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	if strings.Count(string(b), "figures of") != 2 {
		t.Errorf("rewriting the CPU section touched the GPU one:\n%s", b)
	}
}

// TestRunEndToEnd runs the whole tool with small settings on stories260K:
// the raw decode, a real parley process over WebSocket, and, when it has been
// built (scripts/build-ollama.sh), a real `ollama serve`. It checks the
// measurements are complete and plausible and that BENCHMARKS.md is written.
func TestRunEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs servers")
	}
	servers := "parley"
	cache, _ := os.UserCacheDir()
	ollamaBin := filepath.Join(cache, "parley", "ollama", "ollama")
	if p := os.Getenv("PARLEY_BENCH_OLLAMA"); p != "" {
		ollamaBin = p
	}
	if _, err := os.Stat(ollamaBin); err == nil {
		servers += ",ollama"
	} else {
		t.Logf("no ollama binary at %s (scripts/build-ollama.sh builds it): measuring Parley only", ollamaBin)
	}
	dir := t.TempDir()
	out, js := filepath.Join(dir, "BENCHMARKS.md"), filepath.Join(dir, "bench.json")
	args := []string{
		"-parley", testbin.Parley(t), "-ollama", ollamaBin, "-servers", servers,
		"-models", testmodel.Path(t), "-threads", "2", "-parallel", "2", "-ctx", "512",
		"-stream-tokens", "24", "-reply-tokens", "12", "-turns", "3", "-sessions", "1,2", "-repeats", "2",
		"-timeout", "40m", "-workload-timeout", "20m", "-out", out, "-json", js, "-scratch", filepath.Join(dir, "scratch"),
	}
	runTool(t, args)

	var rep struct {
		Models []struct {
			Raw struct {
				Runs []turnResult `json:"runs"`
			}
			Servers []struct {
				Name   string
				Err    string
				Stream *streamResult
				Conv   []concResult
			}
		}
	}
	b := readJSON(t, js, &rep)
	if len(rep.Models) != 1 || len(rep.Models[0].Raw.Runs) != 2 {
		t.Fatalf("report: %s", b)
	}
	for _, r := range rep.Models[0].Raw.Runs {
		if r.Tokens < 2 || r.rate() <= 0 {
			t.Errorf("raw run %+v", r)
		}
	}
	if got := len(rep.Models[0].Servers); got != len(strings.Split(servers, ",")) {
		t.Fatalf("%d servers measured, want %s", got, servers)
	}
	for _, s := range rep.Models[0].Servers {
		if s.Err != "" || s.Stream == nil || len(s.Stream.Runs) != 2 || len(s.Conv) != 2 {
			t.Fatalf("%s: %+v", s.Name, s)
		}
		for _, r := range s.Stream.Runs {
			if r.Tokens < 2 || r.Tokens > 24 || r.TTFT <= 0 || r.rate() <= 0 {
				t.Errorf("%s stream run %+v", s.Name, r)
			}
		}
		for _, c := range s.Conv {
			if len(c.Errors) > 0 || len(c.Turns) != c.Sessions {
				t.Fatalf("%s %d sessions: %v", s.Name, c.Sessions, c.Errors)
			}
			for i, sess := range c.Turns {
				if len(sess) != 3 {
					t.Fatalf("%s session %d: %d turns", s.Name, i, len(sess))
				}
				for k, r := range sess {
					if r.Tokens < 1 || r.Tokens > 12 || r.TTFT <= 0 {
						t.Errorf("%s session %d turn %d: %+v", s.Name, i, k, r)
					}
					// The history grows: each turn's prompt holds the last.
					if k > 0 && r.PromptTokens <= sess[k-1].PromptTokens {
						t.Errorf("%s session %d turn %d: prompt %d tokens, not more than the turn before (%d)", s.Name, i, k, r.PromptTokens, sess[k-1].PromptTokens)
					}
					// Parley says how much of the prompt its KV cache held.
					if s.Name == "parley" && k > 0 && r.CachedTokens <= 0 {
						t.Errorf("parley session %d turn %d: no cached prompt tokens", i, k)
					}
				}
			}
		}
	}

	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{beginMarker, endMarker, "### Single stream", "### Conversations", "| stories260K | parley | 2 |", "### Targets", "WebSocket stream at >= 90% of raw decode"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
		}
	}
	// The paths of this run (a temporary folder, the shared model's) are
	// recorded as the variables the docs use.
	for _, machine := range []string{dir, filepath.Dir(testmodel.Path(t))} {
		if bytes.Contains(md, []byte(machine)) {
			t.Errorf("BENCHMARKS.md names %s, a path of this machine:\n%s", machine, md)
		}
	}
	for _, want := range []string{"-out $OUT/BENCHMARKS.md -json $OUT/bench.json -scratch $OUT/scratch", "-models $MODELS/stories260K.gguf", "`$MODELS/stories260K.gguf`"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "scratch")); err != nil {
		t.Errorf("scratch folder: %v", err)
	}
}

// runTool runs the whole tool with args and returns what it printed; it
// fails the test when the run fails. Its only deadline catches a hang: the
// go test binary's own (-timeout), less a minute to report what it has.
func runTool(t *testing.T, args []string) (stdout, stderr string) {
	t.Helper()
	var out, errs bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-time.Minute))
	}
	defer cancel()
	if err := run(ctx, args, &out, &errs); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errs.String())
	}
	t.Logf("\n%s", out.String())
	return out.String(), errs.String()
}

// readJSON decodes the -json file at path into v and returns its bytes.
func readJSON(t *testing.T, path string, v any) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
	return b
}
