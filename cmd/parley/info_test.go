package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// TestInfoNamesTheEngineThatRuns: /info's engine is the llama.cpp that
// loaded the model (the log's "model loaded" line says which), not always
// the embedded binding: the suite runs this on both engines.
func TestInfoNamesTheEngineThatRuns(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin, "--store", "memory")
	res, err := http.Get("http://" + s.addr + "/info")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var info struct {
		Engine string `json:"engine"`
	}
	if err := json.NewDecoder(res.Body).Decode(&info); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/info: %d %v", res.StatusCode, err)
	}
	var ran string
	for _, line := range strings.Split(s.log(), "\n") {
		var rec struct {
			Msg    string `json:"msg"`
			Engine string `json:"engine"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "model loaded" {
			ran = rec.Engine
		}
	}
	want := map[string]string{"current": "current llama.cpp (ggml ", "embedded": "github.com/ollama/ollama/llama "}[ran]
	if want == "" || !strings.HasPrefix(info.Engine, want) {
		t.Fatalf("the %q engine ran; /info says %q, want it to start with %q", ran, info.Engine, want)
	}
	t.Logf("%s: %s", ran, info.Engine)
}

// TestVersionFlag: --version says Parley's version and its engines', needs
// no model, and exits 0 (run returns flag.ErrHelp, as for --help).
func TestVersionFlag(t *testing.T) {
	var out strings.Builder
	err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run --version: %v", err)
	}
	if !strings.HasPrefix(out.String(), "parley ") || !strings.Contains(out.String(), "engines: embedded github.com/ollama/ollama/llama ") ||
		!strings.Contains(out.String(), "current llama.cpp ggml "+llm.CurrentGGMLVersion) {
		t.Fatalf("--version printed %q", out.String())
	}
	// PARLEY_VERSION in the environment is not --version.
	cfg, err := parseFlags([]string{"--model", "m.gguf"}, func(k string) string {
		return map[string]string{"PARLEY_VERSION": "1.2.3"}[k]
	}, &out)
	if err != nil || cfg.version {
		t.Fatalf("with PARLEY_VERSION set: version %v, %v", cfg.version, err)
	}
}

// TestNormalStartLogsStructuredLinesOnly: a normal start (the test model,
// the default store, either engine) writes only JSON log lines under
// --log-format json, none of them a warning or an error: the binding's own
// line goes through zap, and weights too small for huge pages are no
// cause for a warning.
func TestNormalStartLogsStructuredLinesOnly(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin)
	res, err := http.Get("http://" + s.addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	s.Kill()
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(s.log()), "\n") {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Msg == "" {
			t.Errorf("not a structured log line: %q", line)
			continue
		}
		lines++
		if rec.Level != "info" && rec.Level != "debug" {
			t.Errorf("a %s on a normal start: %s", rec.Level, line)
		}
	}
	if lines < 3 {
		t.Fatalf("only %d log lines: %q", lines, s.log())
	}
}

// engineLabels are the starts of /info's engine for each engine's name in
// the "model loaded" log line.
var engineLabels = map[string]string{"current": "current llama.cpp (ggml ", "embedded": "github.com/ollama/ollama/llama "}

// TestInfoNamesEachModelsEngine: with several models, /info's engine is
// the one that runs the default model (a sentence saying none runs it
// before it loads), and its models list names each loaded model's engine,
// as the log's "model loaded" line for that model says, and none for a
// model not loaded. /v1/models names the same engines.
func TestInfoNamesEachModelsEngine(t *testing.T) {
	bin := testbin.Parley(t)
	dir := t.TempDir()
	b, err := os.ReadFile(testmodel.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stories.gguf"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	synthModel(t, dir, "wide", 2, 128)
	s := launch(t, bin, "--models", dir, "--keep-alive", "-1s", "--store", "memory")

	type infoModel struct {
		Name, State, Engine string
		Default             bool
	}
	info := func() (top string, models map[string]infoModel, def string) {
		t.Helper()
		code, body := call(t, s, "GET", "/info", "", nil)
		var in struct {
			Engine string
			Models []infoModel
		}
		if err := json.Unmarshal(body, &in); err != nil || code != http.StatusOK {
			t.Fatalf("/info: %d %s (%v)", code, body, err)
		}
		models = map[string]infoModel{}
		for _, m := range in.Models {
			models[m.Name] = m
			if m.Default {
				def = m.Name
			}
		}
		if len(models) != 2 || def == "" {
			t.Fatalf("/info's models: %s", body)
		}
		return in.Engine, models, def
	}
	// ran is the engine each model's "model loaded" line names.
	ran := func() map[string]string {
		out := map[string]string{}
		for _, line := range strings.Split(s.log(), "\n") {
			var rec struct{ Msg, Model, Engine string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "model loaded" && rec.Model != "" {
				out[rec.Model] = rec.Engine
			}
		}
		return out
	}

	top, models, def := info()
	for name, m := range models {
		if m.State != "loaded" && m.Engine != "" {
			t.Errorf("%s is %s, yet /info names its engine %q", name, m.State, m.Engine)
		}
	}
	if models[def].State != "loaded" && !strings.HasPrefix(top, "none: ") {
		t.Errorf("the default model %s is %s, yet /info's engine is %q", def, models[def].State, top)
	}

	for name := range models {
		chatWith(t, s, "", name, "Once upon a time", 2)
	}
	top, models, def = info()
	engines := ran()
	listed := listModels(t, s, "")
	for name, m := range models {
		want := engineLabels[engines[name]]
		if m.State != "loaded" || want == "" || !strings.HasPrefix(m.Engine, want) {
			t.Errorf("%s is %s on the %q engine (log); /info names %q, want it to start with %q", name, m.State, engines[name], m.Engine, want)
		}
		if listed[name].Engine != m.Engine {
			t.Errorf("%s: /v1/models names engine %q, /info %q", name, listed[name].Engine, m.Engine)
		}
	}
	if top != models[def].Engine {
		t.Errorf("/info's engine %q, the default model %s runs on %q", top, def, models[def].Engine)
	}
	t.Logf("%s: %s", def, top)
}
