package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/parley-chat/parley"
)

// ---- statistics ----

// percentile returns the p-th percentile (0 < p <= 100) of xs by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. NaN for no values.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

func median(xs []float64) float64 { return percentile(xs, 50) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// streamStats summarizes repeated single-stream runs by their medians.
type streamStats struct {
	N          int
	Tokens     int     // median completion tokens
	Rate       float64 // median client-side decode rate, tokens/s
	ServerRate float64 // median of the server's own figure
	TTFT       float64 // median, ms
}

func summarizeRuns(runs []turnResult) streamStats {
	var rate, srv, ttft, toks []float64
	for _, r := range runs {
		rate = append(rate, r.rate())
		srv = append(srv, r.ServerRate)
		ttft = append(ttft, ms(r.TTFT))
		toks = append(toks, float64(r.Tokens))
	}
	return streamStats{N: len(runs), Tokens: int(median(toks)), Rate: median(rate), ServerRate: median(srv), TTFT: median(ttft)}
}

// convStats summarizes a conversation workload.
type convStats struct {
	Sessions   int
	Turns      int       // turns per session that every session completed
	TTFT50     []float64 // per turn index, ms
	TTFT95     []float64
	Prompt50   []float64 // prompt tokens per turn index (median)
	Cached50   []float64 // cached prompt tokens per turn index (median); -1 when unknown
	StreamRate float64   // median client-side decode rate over all turns, tokens/s
	Aggregate  float64   // all completion tokens / wall time, tokens/s
	Tokens     int       // all completion tokens
	Wall       time.Duration
	Errors     []string
}

func summarizeConv(c concResult) convStats {
	st := convStats{Sessions: c.Sessions, Wall: c.Wall, Errors: c.Errors}
	maxTurns := 0
	var rates []float64
	for _, s := range c.Turns {
		maxTurns = max(maxTurns, len(s))
		for _, r := range s {
			st.Tokens += r.Tokens
			if r.rate() > 0 {
				rates = append(rates, r.rate())
			}
		}
	}
	st.Turns = maxTurns
	for turn := range maxTurns {
		var ttft, prompt, cached []float64
		for _, s := range c.Turns {
			if turn < len(s) {
				ttft = append(ttft, ms(s[turn].TTFT))
				prompt = append(prompt, float64(s[turn].PromptTokens))
				cached = append(cached, float64(s[turn].CachedTokens))
			}
		}
		st.TTFT50 = append(st.TTFT50, percentile(ttft, 50))
		st.TTFT95 = append(st.TTFT95, percentile(ttft, 95))
		st.Prompt50 = append(st.Prompt50, median(prompt))
		st.Cached50 = append(st.Cached50, median(cached))
	}
	st.StreamRate = median(rates)
	if c.Wall > 0 {
		st.Aggregate = float64(st.Tokens) / c.Wall.Seconds()
	}
	return st
}

// lastOverFirst is the turn-N over turn-1 median TTFT ratio.
func (s convStats) lastOverFirst() float64 {
	if len(s.TTFT50) < 2 || s.TTFT50[0] <= 0 {
		return math.NaN()
	}
	return s.TTFT50[len(s.TTFT50)-1] / s.TTFT50[0]
}

// ---- the whole run ----

type envInfo struct {
	CPU       string
	CPUs      int
	Memory    string
	Kernel    string
	Go        string
	Commit    string
	LoadStart string // /proc/loadavg when the run began
	LoadEnd   string
}

type report struct {
	Started, Finished  time.Time
	Env                envInfo
	Command            string
	Cfg                config
	OllamaVersion      string
	LlamaServerVersion string
	Models             []modelReport
	Incomplete         string // why the run stopped early, if it did
}

type modelReport struct {
	Name      string
	Path      string
	SizeBytes int64
	Raw       *rawResult  // the first of Raws: the raw decode of the tables' ratios
	Raws      []rawResult // one per -raw-engines engine
	Servers   []serverReport
}

type serverReport struct {
	Name   string
	Err    string // the server could not be started or warmed up
	Stream *streamResult
	Conv   []concResult
}

// parley is the Parley server of the model's run: "parley", else the first
// Parley on a named engine (parley-embedded, parley-current), so the tables
// of Parley against Ollama have a row when -servers names engines.
func (m modelReport) parley() *serverReport {
	if s := m.server("parley"); s != nil {
		return s
	}
	for i := range m.Servers {
		if strings.HasPrefix(m.Servers[i].Name, parleyOn) {
			return &m.Servers[i]
		}
	}
	return nil
}

func (m modelReport) server(name string) *serverReport {
	for i := range m.Servers {
		if m.Servers[i].Name == name {
			return &m.Servers[i]
		}
	}
	return nil
}

func (s *serverReport) conv(sessions int) *convStats {
	if s == nil {
		return nil
	}
	for _, c := range s.Conv {
		if c.Sessions == sessions {
			st := summarizeConv(c)
			return &st
		}
	}
	return nil
}

func (s *serverReport) stream() *streamStats {
	if s == nil || s.Stream == nil || len(s.Stream.Runs) == 0 {
		return nil
	}
	st := summarizeRuns(s.Stream.Runs)
	return &st
}

func (m modelReport) raw() *streamStats {
	if m.Raw == nil || len(m.Raw.Runs) == 0 {
		return nil
	}
	st := summarizeRuns(m.Raw.Runs)
	return &st
}

// ---- environment ----

func collectEnv(root string) envInfo {
	env := envInfo{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				env.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				var kb float64
				fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "MemTotal:")), "%f", &kb)
				env.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		env.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	env.Commit = gitCommit(root)
	return env
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// gitCommit is the short HEAD, with "+dirty" when the work tree has
// changes (read-only git commands).
func gitCommit(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}

// ---- rendering ----

func f1(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.1f", x)
}

func f2(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

func pct(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}

func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// text renders the results as plain tables for a terminal.
func (r *report) text() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tserver\tworkload\tTTFT p50 t1 ms\tp95 t1\tTTFT p50 tN ms\tp95 tN\ttN/t1\tstream tok/s\tagg tok/s\tvs raw\terrors\t")
	for _, m := range r.Models {
		if raw := m.raw(); raw != nil {
			fmt.Fprintf(tw, "%s\traw llm\t1 x %d tok\t%s\t\t\t\t\t%s\t\t100%%\t\t\n", m.Name, raw.Tokens, f1(raw.TTFT), f1(raw.Rate))
		} else if m.Raw != nil && m.Raw.Err != "" {
			fmt.Fprintf(tw, "%s\traw llm\t\t\t\t\t\t\t\t\t\t%s\t\n", m.Name, short(m.Raw.Err))
		}
		rawRate := math.NaN()
		if raw := m.raw(); raw != nil {
			rawRate = raw.Rate
		}
		for _, s := range m.Servers {
			if s.Err != "" {
				fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\t\t\t\t\t%s\t\n", m.Name, s.Name, short(s.Err))
				continue
			}
			if st := s.stream(); st != nil {
				fmt.Fprintf(tw, "%s\t%s\t1 x %d tok\t%s\t\t\t\t\t%s\t\t%s\t\t\n", m.Name, s.Name, st.Tokens, f1(st.TTFT), f1(st.Rate), pct(ratio(st.Rate, rawRate)))
			} else if s.Stream != nil && s.Stream.Err != "" {
				fmt.Fprintf(tw, "%s\t%s\tstream\t\t\t\t\t\t\t\t\t%s\t\n", m.Name, s.Name, short(s.Stream.Err))
			}
			for _, c := range s.Conv {
				st := summarizeConv(c)
				n := len(st.TTFT50)
				last50, last95, first50, first95 := math.NaN(), math.NaN(), math.NaN(), math.NaN()
				if n > 0 {
					first50, first95, last50, last95 = st.TTFT50[0], st.TTFT95[0], st.TTFT50[n-1], st.TTFT95[n-1]
				}
				fmt.Fprintf(tw, "%s\t%s\t%d x %d turns\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Name, s.Name, c.Sessions, st.Turns,
					f1(first50), f1(first95), f1(last50), f1(last95), f2(st.lastOverFirst()), f1(st.StreamRate), f1(st.Aggregate),
					pct(ratio(st.StreamRate, rawRate)), errSummary(st.Errors))
			}
		}
	}
	tw.Flush()
	for _, line := range r.pairedLines() {
		fmt.Fprintln(&b, line)
	}
	if r.Incomplete != "" {
		fmt.Fprintf(&b, "\nINCOMPLETE: %s\n", r.Incomplete)
	}
	return b.String()
}

func short(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}

func errSummary(errs []string) string {
	switch len(errs) {
	case 0:
		return ""
	case 1:
		return short(errs[0])
	default:
		return fmt.Sprintf("%d errors; first: %s", len(errs), short(errs[0]))
	}
}

// Markers of the generated section of BENCHMARKS.md. Text outside them
// (commentary, other tools' sections) is kept when the file is rewritten.
const (
	beginMarker = "<!-- tools/bench: generated section, rewritten by `make bench` -->"
	endMarker   = "<!-- /tools/bench -->"
)

// mdWriter writes one formatted piece of the markdown report.
type mdWriter func(format string, args ...any)

// markdown renders the generated section: a header, then one table per
// view.
func (r *report) markdown() string {
	var b strings.Builder
	w := mdWriter(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	r.mdHeader(w)
	r.mdModels(w)
	r.mdSingleStream(w)
	r.mdConversations(w)
	r.mdTTFTByTurn(w)
	r.mdTargets(w)
	r.mdPeers(w)
	r.mdPaired(w)
	return b.String()
}

// mdHeader writes the run: date, machine, build, command, device, servers, sampling.
func (r *report) mdHeader(w mdWriter) {
	if r.Cfg.section != "" {
		w("## Results (%s)\n\n", r.Cfg.section)
	} else {
		w("## Results\n\n")
	}
	w("- Date: %s (%s)\n", r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Finished.Sub(r.Started).Round(time.Second))
	w("- Machine: %s, %d CPUs, %s, %s; load average %s at start, %s at end\n", r.Env.CPU, r.Env.CPUs, r.Env.Memory, r.Env.Kernel, r.Env.LoadStart, r.Env.LoadEnd)
	w("- Build: commit %s, %s, CGO_CFLAGS=`%s`\n", r.Env.Commit, r.Env.Go, os.Getenv("CGO_CFLAGS"))
	w("- Command: `%s`\n", r.Command)
	if d := r.device(); d.Backend != "" {
		w("- Device (raw decode's engine): %s %s (%s), %.1f GiB, %d of %d layers offloaded, flash attention %v; Parley `--gpu-layers %s`\n",
			d.Backend, d.Name, d.Type, float64(d.MemoryTotal)/(1<<30), d.LayersOffloaded, d.LayersTotal, d.FlashAttention, r.Cfg.gpuLayers)
	}
	w("- Servers: Parley `--parallel %d --threads %d --ctx %d --flash-attn %s` (WebSocket JSON mode, default durable session store in a scratch dir); "+
		"Ollama %s built from the same module version and CGO flags (`OLLAMA_NUM_PARALLEL=%d`, `num_thread %d`, `num_ctx %d`, flash attention %s, streaming `POST /api/chat` with the whole history each turn, "+
		"a Modelfile TEMPLATE that renders Parley's plain transcript); raw = the `llm` package in-process, one slot, no server, flash attention %s\n",
		r.Cfg.parallel, r.Cfg.threads, r.Cfg.ctx, r.Cfg.flashAttn, orUnknown(r.OllamaVersion), r.Cfg.parallel, r.Cfg.threads, r.Cfg.ctx, r.Cfg.flashAttn, r.Cfg.flashAttn)
	runs := fmt.Sprintf("median of %d runs on fresh sessions", r.Cfg.repeats)
	if r.Cfg.paired > 0 {
		runs = fmt.Sprintf("median of %d paired rounds (one run on a fresh session per round; conversations: every round's sessions)", r.Cfg.paired)
	}
	w("- Sampling: greedy (temperature 0), repetition penalty off, seed %d, the same stop strings; single stream: %d tokens, %s; conversations: %s sessions x %d turns, replies capped at %d tokens\n",
		r.Cfg.seed, r.Cfg.streamTokens, runs, joinInts(r.Cfg.concurrency), r.Cfg.turns, r.Cfg.replyTokens)
	w("- Figures are client-side: TTFT from sending the prompt to the first token message; stream tok/s = (tokens - 1) / (first token -> end of reply), median over turns; aggregate tok/s = all tokens / wall time of the workload\n")
	if r.Incomplete != "" {
		w("\n**Incomplete run:** %s\n", r.Incomplete)
	}
}

// mdModels writes the models table.
func (r *report) mdModels(w mdWriter) {
	w("\n### Models\n\n| model | parameters | size | layers | dim | vocab | file |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, m := range r.Models {
		if m.Raw != nil && m.Raw.Info.Architecture != "" {
			i := m.Raw.Info
			w("| %s | %s | %.1f MiB | %d | %d | %d | `%s` (%s) |\n", m.Name, human(i.Parameters), float64(m.SizeBytes)/(1<<20), i.Layers, i.EmbeddingLength, i.VocabSize, modelFile(m.Path), i.Quantization)
		} else {
			w("| %s | ? | %.1f MiB | ? | ? | ? | `%s` |\n", m.Name, float64(m.SizeBytes)/(1<<20), modelFile(m.Path))
		}
	}
}

// mdSingleStream writes the single-stream table.
func (r *report) mdSingleStream(w mdWriter) {
	w("\n### Single stream\n\n| model | raw tok/s | Parley tok/s | Parley / raw | Ollama tok/s | Ollama / raw | Parley / Ollama | TTFT ms raw / Parley / Ollama |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.Models {
		raw, p, o := m.raw(), m.parley().stream(), m.server("ollama").stream()
		rr, pr, or, rt, pt, ot := math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
		if raw != nil {
			rr, rt = raw.Rate, raw.TTFT
		}
		if p != nil {
			pr, pt = p.Rate, p.TTFT
		}
		if o != nil {
			or, ot = o.Rate, o.TTFT
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |\n", m.Name, f1(rr), f1(pr), pct(ratio(pr, rr)), f1(or), pct(ratio(or, rr)), f2(ratio(pr, or)), f1(rt), f1(pt), f1(ot))
	}
}

// mdConversations writes the conversations table.
func (r *report) mdConversations(w mdWriter) {
	w("\n### Conversations\n\n| model | server | sessions | TTFT t1 p50 / p95 ms | TTFT t%d p50 / p95 ms | t%d / t1 | stream tok/s | vs raw | aggregate tok/s | vs 1 session | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n", r.Cfg.turns, r.Cfg.turns)
	for _, m := range r.Models {
		rawRate := math.NaN()
		if raw := m.raw(); raw != nil {
			rawRate = raw.Rate
		}
		for _, s := range m.Servers {
			if s.Err != "" {
				w("| %s | %s | | | | | | | | | %s |\n", m.Name, s.Name, mdEscape(short(s.Err)))
				continue
			}
			one := s.conv(1)
			for _, c := range s.Conv {
				st := summarizeConv(c)
				n := len(st.TTFT50)
				if n == 0 {
					w("| %s | %s | %d | | | | | | | | %s |\n", m.Name, s.Name, c.Sessions, mdEscape(errSummary(st.Errors)))
					continue
				}
				vsOne := math.NaN()
				if one != nil {
					vsOne = ratio(st.Aggregate, one.Aggregate)
				}
				w("| %s | %s | %d | %s / %s | %s / %s | %s | %s | %s | %s | %s | %s |\n", m.Name, s.Name, c.Sessions,
					f1(st.TTFT50[0]), f1(st.TTFT95[0]), f1(st.TTFT50[n-1]), f1(st.TTFT95[n-1]), f2(st.lastOverFirst()),
					f1(st.StreamRate), pct(ratio(st.StreamRate, rawRate)), f1(st.Aggregate), f2(vsOne), mdEscape(errSummary(st.Errors)))
			}
		}
	}
}

// mdTTFTByTurn writes the TTFT of every turn.
func (r *report) mdTTFTByTurn(w mdWriter) {
	w("\n### TTFT by turn (p50 ms; prompt tokens / of them cached, Parley)\n\n")
	w("| model | server | sessions |")
	for t := range r.Cfg.turns {
		w(" t%d |", t+1)
	}
	w("\n|---|---|---:|%s\n", strings.Repeat("---:|", r.Cfg.turns))
	for _, m := range r.Models {
		for _, s := range m.Servers {
			for _, c := range s.Conv {
				st := summarizeConv(c)
				w("| %s | %s | %d |", m.Name, s.Name, c.Sessions)
				for t := range r.Cfg.turns {
					if t >= len(st.TTFT50) {
						w(" |")
						continue
					}
					cell := f1(st.TTFT50[t])
					if st.Cached50[t] >= 0 {
						cell += fmt.Sprintf(" (%.0f/%.0f)", st.Prompt50[t], st.Cached50[t])
					} else {
						cell += fmt.Sprintf(" (%.0f)", st.Prompt50[t])
					}
					w(" %s |", cell)
				}
				w("\n")
			}
		}
	}
}

// mdTargets writes the targets, met or not.
func (r *report) mdTargets(w mdWriter) {
	if r.Cfg.section == "gpu" {
		w("\n### Targets (CPU and GPU)\n\n")
	} else {
		w("\n### Targets\n\n")
	}
	for _, line := range r.targets() {
		w("- %s\n", line)
	}
}

// targets checks the figures against the targets, one line each.
// device is where the raw decode ran (the first model's), which is where
// Parley runs with the same -gpu-layers.
func (r *report) device() parley.Device {
	for _, m := range r.Models {
		if m.Raw != nil && m.Raw.Info.Device.Backend != "" {
			return m.Raw.Info.Device
		}
	}
	return parley.Device{}
}

// gpuTargets are the targets for a GPU run (-section gpu): Parley's
// aggregate over Ollama's at these numbers of sessions, with 0 errors.
var gpuTargets = map[int]float64{16: 3, 64: 10}

// gpuStreamTarget is the GPU run's single stream over the raw decode.
const gpuStreamTarget = 0.95

func (r *report) targets() []string {
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	var out []string
	maxC := 0
	for _, c := range r.Cfg.concurrency {
		maxC = max(maxC, c)
	}
	for _, m := range r.Models {
		raw, p, o := m.raw(), m.parley().stream(), m.server("ollama").stream()
		if raw != nil && p != nil {
			x := ratio(p.Rate, raw.Rate)
			out = append(out, fmt.Sprintf("%s: WebSocket stream at >= 90%% of raw decode: %s (%s)", m.Name, pct(x), mark(x >= 0.9)))
		}
		ps := m.parley()
		for _, c := range r.Cfg.concurrency {
			if st := ps.conv(c); st != nil && len(st.TTFT50) > 1 {
				x := st.lastOverFirst()
				out = append(out, fmt.Sprintf("%s, %d sessions: TTFT turn %d <= 1.3x turn 1 (p50): %sx (%s)", m.Name, c, len(st.TTFT50), f2(x), mark(x <= 1.3)))
			}
		}
		if one, many := ps.conv(1), ps.conv(maxC); one != nil && many != nil && maxC > 1 {
			x := ratio(many.Aggregate, one.Aggregate)
			out = append(out, fmt.Sprintf("%s: aggregate with %d sessions >= 1.5x one session's: %sx (%s)", m.Name, maxC, f2(x), mark(x >= 1.5)))
		}
		ol := m.server("ollama")
		if r.Cfg.section == "gpu" {
			if raw != nil && p != nil {
				x := ratio(p.Rate, raw.Rate)
				out = append(out, fmt.Sprintf("%s (GPU): single stream >= 95%% of raw decode: %s (%s)", m.Name, pct(x), mark(x >= gpuStreamTarget)))
			}
			for _, c := range r.Cfg.concurrency {
				want, ok := gpuTargets[c]
				pc, oc := ps.conv(c), ol.conv(c)
				if !ok || pc == nil || oc == nil {
					continue
				}
				var errs int
				for _, cr := range ps.Conv {
					if cr.Sessions == c {
						errs = len(cr.Errors)
					}
				}
				x := ratio(pc.Aggregate, oc.Aggregate)
				out = append(out, fmt.Sprintf("%s (GPU), %d sessions: aggregate >= %gx Ollama's with 0 errors: %s vs %s tok/s = %sx, %d errors (%s)",
					m.Name, c, want, f1(pc.Aggregate), f1(oc.Aggregate), f2(x), errs, mark(x >= want && errs == 0)))
			}
		}
		if p != nil && o != nil {
			out = append(out, fmt.Sprintf("%s: single stream ahead of Ollama: %s vs %s tok/s (%s); TTFT %s vs %s ms (%s)", m.Name,
				f1(p.Rate), f1(o.Rate), mark(p.Rate > o.Rate), f1(p.TTFT), f1(o.TTFT), mark(p.TTFT < o.TTFT)))
		}
		for _, c := range r.Cfg.concurrency {
			pc, oc := ps.conv(c), ol.conv(c)
			if pc == nil || oc == nil || len(pc.TTFT50) == 0 || len(oc.TTFT50) == 0 {
				continue
			}
			var behind []string
			for t := range min(len(pc.TTFT50), len(oc.TTFT50)) {
				if pc.TTFT50[t] >= oc.TTFT50[t] {
					behind = append(behind, fmt.Sprintf("t%d", t+1))
				}
			}
			ttft := "every turn's p50 TTFT ahead (met)"
			if len(behind) > 0 {
				ttft = "p50 TTFT not ahead at " + strings.Join(behind, ", ") + " (**missed**)"
			}
			out = append(out, fmt.Sprintf("%s, %d sessions vs Ollama: stream %s vs %s tok/s (%s), aggregate %s vs %s tok/s (%s), %s", m.Name, c,
				f1(pc.StreamRate), f1(oc.StreamRate), mark(pc.StreamRate > oc.StreamRate),
				f1(pc.Aggregate), f1(oc.Aggregate), mark(pc.Aggregate > oc.Aggregate), ttft))
		}
	}
	return out
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, "/")
}

func human(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
