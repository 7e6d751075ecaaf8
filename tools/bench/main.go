// Command bench measures Parley against Ollama and against the raw decode
// rate of the llm package, on the same models, threads and parallelism, in
// one bounded run on loopback, and writes the table into BENCHMARKS.md.
//
// For each model (by default stories260K and the synthetic SmolLM2-135M-shaped
// model that tools/mkgguf writes):
//
//  1. raw: the model opened in-process with llm.Open and decoded greedily,
//     no server: the limit a single stream can approach;
//  2. parley: `parley --model M --parallel N --threads T --ctx C` on a free
//     loopback port, driven over its WebSocket JSON mode;
//  3. ollama: `ollama serve` (built by scripts/build-ollama.sh from the
//     same github.com/ollama/ollama version and CGO flags) with
//     OLLAMA_NUM_PARALLEL=N, the same GGUF imported by `ollama create`, driven
//     by streaming POST /api/chat with the whole history each turn.
//
// Workloads per server: one session streaming -stream-tokens tokens (median of
// -repeats runs), and -sessions concurrent sessions of -turns turns each
// (replies capped at -reply-tokens). Every workload has its own deadline
// (-workload-timeout) and the whole run has one (-timeout); whatever was
// measured before a deadline is still reported.
//
// Usage (what `make bench` runs):
//
//	scripts/build-ollama.sh
//	go run ./tools/mkgguf
//	go run ./tools/bench -parley bin/parley
//
// With -paired N every server of a model runs at once and each of N rounds
// runs every workload once on each in turn, so that a noisy machine's slow
// minutes fall on both sides of a comparison (paired.go).
//
// On a GPU, scripts/bench-gpu.sh runs it with -gpu-layers auto,
// flash attention on, 64 slots and 1, 16 and 64 sessions on a synthetic
// Llama-3.2-1B-shaped model, and -section gpu, which writes a section of its
// own into BENCHMARKS.md and checks the GPU targets.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/tools/internal/benchmd"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() {
	if llm.GPUProbeChild(os.Getenv) {
		// This process is the current engine's GPU probe (the raw loop on a GPU starts it).
		os.Exit(llm.ServeGPUProbe(os.Getenv))
	}
	harness.Main("bench", func(ctx context.Context, args []string, stdout io.Writer) error {
		return run(ctx, args, stdout, os.Stderr)
	})
}

type config struct {
	parleyBin       string
	ollamaBin       string
	models          []string
	servers         []string
	threads         int
	flashAttn       string
	gpuLayers       string // parley --gpu-layers and the raw decode's llm.Config.GPULayers: auto or a count
	section         string // "" (the CPU section of BENCHMARKS.md) or a name for a section of its own ("gpu")
	parallel        int
	ctx             int
	streamTokens    int
	replyTokens     int
	turns           int
	repeats         int
	paired          int // > 0: every server up at once, this many rounds of every workload on each in turn (paired.go)
	concurrency     []int
	timeout         time.Duration
	workloadTimeout time.Duration
	seed            int64
	raw             bool
	out             string
	jsonOut         string
	scratch         string
	keep            bool
	parleyArgs      []string
	engine          string // parley --engine and the raw decode's llm.Config.Engine
	peers           peerConfig
}

// flagLists are the flags that parseFlags splits into config's lists.
type flagLists struct{ models, servers, sessions, pargs, rawEngines string }

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var (
		c     config
		lists flagLists
	)
	fs := newFlagSet(&c, &lists, stderr)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := c.setLists(lists); err != nil {
		return c, err
	}
	if err := c.check(stderr); err != nil {
		return c, err
	}
	return c, c.resolvePaths()
}

// newFlagSet defines bench's flags, which fill c and lists.
func newFlagSet(c *config, lists *flagLists, stderr io.Writer) *flag.FlagSet {
	root := repo.WorkingRoot()
	cache, _ := os.UserCacheDir()
	models, servers, sessions, pargs := &lists.models, &lists.servers, &lists.sessions, &lists.pargs
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.parleyBin, "parley", filepath.Join(root, "bin", "parley"), "parley binary (make build)")
	fs.StringVar(&c.ollamaBin, "ollama", filepath.Join(cache, "parley", "ollama", "ollama"), "ollama binary (scripts/build-ollama.sh)")
	fs.StringVar(models, "models", strings.Join([]string{
		repo.TestModel(root),
		filepath.Join(cache, "parley", "models", "synthetic-smollm2-135m-f16.gguf"),
	}, ","), "comma-separated GGUF files")
	fs.StringVar(servers, "servers", "parley,ollama", "comma-separated servers to measure: parley (on -engine), parley-embedded, parley-current, ollama, llama-server")
	fs.IntVar(&c.threads, "threads", max(1, runtime.NumCPU()/2), "CPU threads, the same for every server and the raw decode (default: parley's own default)")
	fs.StringVar(&c.flashAttn, "flash-attn", "off", "flash attention (off, on, auto), the same for every server and the raw decode")
	fs.StringVar(&c.gpuLayers, "gpu-layers", "0", "layers offloaded to the GPU by Parley and the raw decode: 0 (CPU), auto or a count; Ollama offloads what fits by itself. Needs lib/ollama/libggml-cuda.so beside bin/ (make cuda)")
	fs.StringVar(&c.section, "section", "", "BENCHMARKS.md section to rewrite: \"\" for the CPU one, or a name (gpu) for a section of its own, which also checks the GPU targets")
	fs.IntVar(&c.parallel, "parallel", 8, "parallel sequences: parley --parallel and OLLAMA_NUM_PARALLEL")
	fs.IntVar(&c.ctx, "ctx", 2048, "context tokens per session: parley --ctx and Ollama num_ctx")
	fs.IntVar(&c.streamTokens, "stream-tokens", 256, "tokens of the single-stream workload")
	fs.IntVar(&c.replyTokens, "reply-tokens", 64, "reply cap of each conversation turn")
	fs.IntVar(&c.turns, "turns", 10, "turns per conversation")
	fs.StringVar(sessions, "sessions", "1,4,8", "comma-separated numbers of concurrent conversations")
	fs.IntVar(&c.repeats, "repeats", 3, "runs of the single-stream workload and the raw decode (the median is reported)")
	fs.IntVar(&c.paired, "paired", 0, "instead of one server after another, start every server at once and run this many rounds, each running every workload once on each server in turn (the order rotating), and compare the servers round by round: for a noisy machine")
	fs.DurationVar(&c.timeout, "timeout", 15*time.Minute, "deadline of the whole run")
	fs.DurationVar(&c.workloadTimeout, "workload-timeout", 4*time.Minute, "deadline of each workload")
	fs.Int64Var(&c.seed, "seed", 1, "sampling seed sent with every request")
	fs.BoolVar(&c.raw, "raw", true, "measure the in-process raw decode rate")
	fs.StringVar(&c.out, "out", filepath.Join(root, "BENCHMARKS.md"), "markdown file to write the results into (\"\" = none)")
	fs.StringVar(&c.jsonOut, "json", "", "also write every measurement as JSON to this file")
	fs.StringVar(&c.scratch, "scratch", "", "folder for server logs, session data and the Ollama store (default: a temporary folder)")
	fs.BoolVar(&c.keep, "keep", false, "keep the scratch folder (it is always kept when something failed)")
	fs.StringVar(&c.engine, "engine", "auto", "llama.cpp engine of Parley and the raw decode: auto (Parley's default: current when its libraries load), embedded or current (the current engine's libraries: lib/llama-current or $PARLEY_ENGINE_LIB)")
	fs.StringVar(pargs, "parley-args", "", "extra space-separated arguments for parley")
	c.peers.register(fs, &lists.rawEngines, cache)
	return fs
}

// setLists splits the list flags into c.
func (c *config) setLists(l flagLists) error {
	c.models = splitList(l.models)
	c.servers = splitList(l.servers)
	c.parleyArgs = append(strings.Fields(l.pargs), "--engine", c.engine)
	for _, s := range splitList(l.sessions) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("-sessions: %q is not a positive number", s)
		}
		c.concurrency = append(c.concurrency, n)
	}
	for _, s := range c.servers {
		if !knownServer(s) {
			return fmt.Errorf("-servers: unknown server %q", s)
		}
	}
	return c.setRawEngines(l.rawEngines)
}

// check refuses settings out of range, and notes on stderr a number of
// sessions that some must wait for a slot at.
func (c *config) check(stderr io.Writer) error {
	switch {
	case len(c.models) == 0:
		return errors.New("-models: no model")
	case c.threads < 1 || c.parallel < 1 || c.ctx < 64 || c.repeats < 1 || c.turns < 1:
		return errors.New("-threads, -parallel, -repeats and -turns must be positive, -ctx at least 64")
	case c.streamTokens < 2 || c.replyTokens < 2:
		return errors.New("-stream-tokens and -reply-tokens must be at least 2")
	case c.gpuLayers != "auto" && !isCount(c.gpuLayers):
		return fmt.Errorf("-gpu-layers: want auto or a count, got %q", c.gpuLayers)
	case c.timeout <= 0 || c.workloadTimeout <= 0:
		return errors.New("-timeout and -workload-timeout must be positive")
	case c.paired < 0:
		return errors.New("-paired must not be negative")
	case c.paired > 0 && len(c.servers) < 2:
		return errors.New("-paired compares servers: -servers needs at least two")
	}
	for _, n := range c.concurrency {
		if n > c.parallel {
			fmt.Fprintf(stderr, "bench: note: %d sessions with -parallel %d: some wait for a slot\n", n, c.parallel)
		}
	}
	return nil
}

// resolvePaths makes the model and binary paths absolute and checks that
// they exist.
func (c *config) resolvePaths() error {
	for i, m := range c.models {
		abs, err := filepath.Abs(m)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			hint := ""
			if strings.Contains(filepath.Base(abs), "synthetic") {
				hint = " (write it with: go run ./tools/mkgguf -o " + abs + ")"
			}
			return fmt.Errorf("model %s: %w%s", abs, err, hint)
		}
		c.models[i] = abs
	}
	for _, s := range c.servers {
		bin, hint := &c.parleyBin, "make build"
		switch s {
		case "ollama":
			bin, hint = &c.ollamaBin, "scripts/build-ollama.sh"
		case llamaServerName:
			bin, hint = &c.peers.llamaServerBin, "scripts/build-llama-server.sh"
		}
		abs, err := filepath.Abs(*bin)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%s binary %s: %w (build it with: %s, or drop it with -servers)", s, abs, err, hint)
		}
		*bin = abs
	}
	return nil
}

// isCount reports whether s is a non-negative decimal number.
func isCount(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0
}

// gpuLayers turns -gpu-layers into llm.Config.GPULayers (auto is -1).
func gpuLayers(s string) int {
	if s == "auto" {
		return -1
	}
	n, _ := strconv.Atoi(s) // checked by parseFlags
	return n
}

// sectionMarkers are the markers of the BENCHMARKS.md section a run
// rewrites: the CPU section's, or those of a named one, so a GPU run does
// not overwrite the CPU figures.
func sectionMarkers(name string) benchmd.Markers {
	if name == "" {
		return benchmd.Markers{Begin: beginMarker, End: endMarker}
	}
	return benchmd.Markers{
		Begin: "<!-- tools/bench " + name + ": generated section, rewritten by `tools/bench -section " + name + "` -->",
		End:   "<!-- /tools/bench " + name + " -->",
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// llama.cpp logs through slog's default logger (the raw decode runs it
	// in this process); only its errors belong on the terminal.
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError})))

	plain, err := chat.TemplateByName(chat.NamePlain)
	if err != nil {
		return err
	}
	stops := plain.Stops()

	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()

	scratch := cfg.scratch
	if scratch == "" {
		if scratch, err = os.MkdirTemp("", "parley-bench-*"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }

	rep := &report{
		Started: time.Now(),
		Env:     collectEnv(repo.WorkingRoot()),
		Command: recordedCommand(repo.WorkingRoot(), args),
		Cfg:     cfg,
	}
	failures := 0
	for _, model := range cfg.models {
		if ctx.Err() != nil {
			break
		}
		mr, failed := benchModel(ctx, cfg, model, scratch, stops, rep, logf)
		failures += failed
		rep.Models = append(rep.Models, mr)
	}
	if ctx.Err() != nil {
		rep.Incomplete = fmt.Sprintf("stopped after %s: %v", time.Since(rep.Started).Round(time.Second), context.Cause(ctx))
		failures++
	}
	rep.Finished = time.Now()
	rep.Env.LoadEnd = loadavg()
	if err := writeReport(rep, cfg, stdout, logf); err != nil {
		return err
	}
	// Only a folder this run created is removed; a -scratch folder is the user's.
	if failures > 0 || cfg.keep || cfg.scratch != "" {
		logf("logs and data kept in %s", scratch)
	} else {
		os.RemoveAll(scratch)
	}
	if failures > 0 {
		return fmt.Errorf("%d workload(s) failed or did not finish; see the table and the logs in %s", failures, scratch)
	}
	return nil
}

// benchModel runs every workload on one model: the raw decode, then each
// server. It reports the model's results and how many workloads failed;
// the Ollama version it saw goes into rep.
func benchModel(ctx context.Context, cfg config, model, scratch string, stops []string, rep *report, logf func(string, ...any)) (modelReport, int) {
	failures := 0
	mr := modelReport{Name: strings.TrimSuffix(filepath.Base(model), ".gguf"), Path: model}
	if st, err := os.Stat(model); err == nil {
		mr.SizeBytes = st.Size()
	}
	for i, engine := range cfg.peers.rawEngines {
		if !cfg.raw || cfg.paired > 0 || ctx.Err() != nil { // a paired run decodes them round by round
			break
		}
		logf("%s: raw decode, %s engine (%d x %d tokens)", mr.Name, engine, cfg.repeats, cfg.streamTokens)
		wctx, wcancel := context.WithTimeout(ctx, cfg.workloadTimeout)
		raw := runRaw(wctx, model, engine, cfg.peers.engineLib, cfg.ctx, cfg.threads, cfg.flashAttn, gpuLayers(cfg.gpuLayers), cfg.streamTokens, cfg.repeats, cfg.seed)
		wcancel()
		raw.Engine = engine
		if i == 0 {
			mr.Raw = &raw // the raw decode of the tables' ratios
		}
		mr.Raws = append(mr.Raws, raw)
		if raw.Err != "" {
			failures++
			logf("%s: raw decode (%s): %s", mr.Name, engine, raw.Err)
		} else {
			logf("%s: raw decode (%s) %.1f tok/s", mr.Name, engine, summarizeRuns(raw.Runs).Rate)
		}
	}
	sc := serverConfig{model: model, ctx: cfg.ctx, parallel: cfg.parallel, threads: cfg.threads, flashAttn: cfg.flashAttn, gpuLayers: cfg.gpuLayers,
		maxReply: max(cfg.streamTokens, cfg.replyTokens), scratch: scratch, stops: stops}
	if cfg.paired > 0 {
		servers, raws, versions := runPaired(ctx, cfg, sc, logf)
		mr.Raws = raws
		if len(raws) > 0 {
			mr.Raw = &mr.Raws[0] // the raw decode of the tables' ratios
		}
		for _, r := range raws {
			if r.Err != "" {
				failures++
			}
		}
		for _, sr := range servers {
			rep.noteVersion(sr.Name, versions[sr.Name])
			failures += sr.failures()
		}
		mr.Servers = servers
		return mr, failures
	}
	for _, name := range cfg.servers {
		if ctx.Err() != nil {
			break
		}
		ssc, err := sc.forServer(name) // a scratch folder per server: its log and data
		if err != nil {
			mr.Servers = append(mr.Servers, serverReport{Name: name, Err: err.Error()})
			failures++
			continue
		}
		sr, version := runServer(ctx, cfg, name, ssc, logf)
		rep.noteVersion(name, version)
		failures += sr.failures()
		mr.Servers = append(mr.Servers, sr)
	}
	return mr, failures
}

// noteVersion records the version a peer server reported.
func (r *report) noteVersion(server, version string) {
	switch {
	case version == "":
	case server == llamaServerName:
		r.LlamaServerVersion = version
	default:
		r.OllamaVersion = version
	}
}

// writeReport prints rep and its targets to stdout and writes it into
// cfg.out's section and cfg.jsonOut when they are set.
func writeReport(rep *report, cfg config, stdout io.Writer, logf func(string, ...any)) error {
	fmt.Fprint(stdout, rep.text())
	for _, line := range rep.targets() {
		fmt.Fprintln(stdout, "target:", strings.ReplaceAll(line, "**", ""))
	}
	if cfg.out != "" {
		if err := benchmd.WriteSection(cfg.out, sectionMarkers(cfg.section), rep.markdown()); err != nil {
			return err
		}
		logf("wrote %s", cfg.out)
	}
	if cfg.jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (s serverReport) failures() int {
	n := 0
	if s.Err != "" {
		n++
	}
	if s.Stream != nil && s.Stream.Err != "" {
		n++
	}
	for _, c := range s.Conv {
		if len(c.Errors) > 0 {
			n++
		}
	}
	return n
}

// runServer starts one server on the model, warms it up, runs every
// workload under its own deadline, and stops it. It returns Ollama's version
// when it ran Ollama.
func runServer(ctx context.Context, cfg config, name string, sc serverConfig, logf func(string, ...any)) (serverReport, string) {
	sr := serverReport{Name: name}
	model := strings.TrimSuffix(filepath.Base(sc.model), ".gguf")
	p, tgt, version, err := startTarget(ctx, cfg, name, sc, logf)
	if err != nil {
		sr.Err = err.Error()
		logf("%s: %s: %v", model, name, err)
		return sr, version
	}
	defer p.stop(15 * time.Second)
	defer tgt.Close()

	wctx, wcancel := context.WithTimeout(ctx, cfg.workloadTimeout)
	err = warmup(wctx, tgt, cfg.seed)
	wcancel()
	if err != nil {
		sr.Err = fmt.Sprintf("warm-up: %v", err)
		logf("%s: %s: %s", model, name, sr.Err)
		return sr, version
	}

	wctx, wcancel = context.WithTimeout(ctx, cfg.workloadTimeout)
	st := runStream(wctx, tgt, cfg.streamTokens, cfg.repeats, cfg.seed)
	wcancel()
	sr.Stream = &st
	if st.Err != "" {
		logf("%s: %s: stream: %s", model, name, st.Err)
	} else {
		s := summarizeRuns(st.Runs)
		logf("%s: %s: stream %.1f tok/s, TTFT %.1f ms, %d tokens", model, name, s.Rate, s.TTFT, s.Tokens)
	}
	first := 0 // sessions are numbered across workloads so that none repeats another's prompts
	for _, n := range cfg.concurrency {
		if ctx.Err() != nil {
			break
		}
		wctx, wcancel := context.WithTimeout(ctx, cfg.workloadTimeout)
		c := runConversations(wctx, tgt, first, n, cfg.turns, cfg.replyTokens, cfg.seed)
		first += n
		wcancel()
		sr.Conv = append(sr.Conv, c)
		s := summarizeConv(c)
		logf("%s: %s: %d sessions x %d turns: aggregate %.1f tok/s, stream %.1f tok/s, TTFT t1 %s ms, t%d %s ms%s",
			model, name, n, s.Turns, s.Aggregate, s.StreamRate, f1(at(s.TTFT50, 0)), s.Turns, f1(at(s.TTFT50, s.Turns-1)), errNote(c.Errors))
	}
	if err := p.exited(); err != nil {
		sr.Err = err.Error()
	}
	return sr, version
}

// startTarget starts the server name on sc's model and returns its process,
// the client that drives it and, for Ollama and llama-server, its version.
func startTarget(ctx context.Context, cfg config, name string, sc serverConfig, logf func(string, ...any)) (p *server, tgt target, version string, err error) {
	logf("%s: starting %s", strings.TrimSuffix(filepath.Base(sc.model), ".gguf"), name)
	switch name {
	case "parley", parleyOn + "embedded", parleyOn + "current":
		var addr string
		p, addr, err = startParley(ctx, cfg.parleyBin, sc, cfg.parleyArgsFor(name))
		tgt = parleyTarget{addr: addr}
	case llamaServerName:
		var lt llamaServerTarget
		p, lt, err = startLlamaServer(ctx, cfg.peers.llamaServerBin, sc)
		tgt = lt
		version = llamaServerVersion(ctx, cfg.peers.llamaServerBin)
	case "ollama":
		var ot ollamaTarget
		p, ot, err = startOllama(ctx, cfg.ollamaBin, sc)
		tgt = ot
		if err == nil {
			version = ollamaVersion(ctx, ot.addr)
		}
	default:
		err = fmt.Errorf("unknown server %q", name)
	}
	return p, tgt, version, err
}

func at(xs []float64, i int) float64 {
	if i < 0 || i >= len(xs) {
		return -1
	}
	return xs[i]
}

func errNote(errs []string) string {
	if len(errs) == 0 {
		return ""
	}
	return "; " + errSummary(errs)
}

// ollamaVersion asks the running server (GET /api/version).
func ollamaVersion(ctx context.Context, addr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/version", nil)
	if err != nil {
		return ""
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct {
		Version string `json:"version"`
	}
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return ""
	}
	return v.Version
}
