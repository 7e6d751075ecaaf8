package main

// Issue 32's comparison: Parley on each engine (the embedded binding and a
// current llama.cpp), the raw decode loop of each engine, llama-server and
// Ollama, on the same models, threads and slots; its flags, and its table
// and targets in the generated section of BENCHMARKS.md.

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/llm"
)

// parleyOn prefixes a -servers name that runs Parley on a given engine
// (parley-embedded, parley-current); plain "parley" runs it on -engine.
const parleyOn = "parley-"

// peerConfig is the part of config that the peers add.
type peerConfig struct {
	llamaServerBin string
	engineLib      string   // the current engine's libraries, for Parley (--engine-lib) and the raw decode
	rawEngines     []string // engines whose raw decode loop is measured; the first is "raw" in the tables
}

func (p *peerConfig) register(fs *flag.FlagSet, rawEngines *string, cache string) {
	lib := os.Getenv("PARLEY_ENGINE_LIB")
	if lib == "" {
		lib = filepath.Join(repo.WorkingRoot(), "lib", "llama-current")
	}
	fs.StringVar(&p.llamaServerBin, "llama-server", filepath.Join(cache, "parley", "llama-server", "bin", "llama-server"), "llama-server binary (scripts/build-llama-server.sh)")
	fs.StringVar(&p.engineLib, "engine-lib", lib, "folder of the current engine's libraries (parley --engine-lib and the raw decode; default $PARLEY_ENGINE_LIB, else lib/llama-current)")
	fs.StringVar(rawEngines, "raw-engines", "", "comma-separated engines whose raw decode loop is measured (embedded, current); the first is the raw decode the tables compare with (default: -engine)")
}

// setRawEngines checks and sets -raw-engines (default: -engine alone).
func (c *config) setRawEngines(list string) error {
	c.peers.rawEngines = splitList(list)
	if len(c.peers.rawEngines) == 0 {
		c.peers.rawEngines = []string{c.engine}
	}
	for _, e := range c.peers.rawEngines {
		if !knownEngine(e) {
			return fmt.Errorf("-raw-engines: unknown engine %q (want embedded, current or auto)", e)
		}
	}
	if !knownEngine(c.engine) {
		return fmt.Errorf("-engine: unknown engine %q (want embedded, current or auto)", c.engine)
	}
	return nil
}

func knownEngine(e string) bool {
	return e == llm.EngineEmbedded || e == llm.EngineCurrent || e == llm.EngineAuto
}

// knownServer reports whether name is a -servers name.
func knownServer(name string) bool {
	switch name {
	case "parley", "ollama", llamaServerName, parleyOn + llm.EngineEmbedded, parleyOn + llm.EngineCurrent:
		return true
	}
	return false
}

// parleyEngine is the engine a Parley -servers name runs on; "" for the
// other servers.
func (c *config) parleyEngine(name string) string {
	if name == "parley" {
		return c.engine
	}
	if e, ok := strings.CutPrefix(name, parleyOn); ok {
		return e
	}
	return ""
}

// parleyArgsFor is parley's extra arguments for a Parley -servers name:
// -parley-args, its engine, and the current engine's libraries (the
// benchmark drops PARLEY_ variables from parley's environment, so
// $PARLEY_ENGINE_LIB would not reach it).
func (c *config) parleyArgsFor(name string) []string {
	args := slices.Clone(c.parleyArgs) // ends with --engine c.engine
	if e := c.parleyEngine(name); e != c.engine {
		args = append(args, "--engine", e)
	}
	if c.peers.engineLib != "" {
		args = append(args, "--engine-lib", c.peers.engineLib)
	}
	return args
}

// forServer gives each server of a model a scratch folder of its own, so
// that Parley on two engines keeps two logs and two session stores.
func (sc serverConfig) forServer(name string) (serverConfig, error) {
	sc.scratch = filepath.Join(sc.scratch, name)
	return sc, os.MkdirAll(sc.scratch, 0o755)
}

// rawFor is the model's raw decode on engine, if it was measured.
func (m modelReport) rawFor(engine string) *streamStats {
	runs := m.rawRuns(engine)
	if len(runs) == 0 {
		return nil
	}
	st := summarizeRuns(runs)
	return &st
}

// rawRuns are the runs of the model's raw decode on engine ("" for none).
func (m modelReport) rawRuns(engine string) []turnResult {
	for _, r := range m.Raws {
		if engine != "" && r.Engine == engine && len(r.Runs) > 0 {
			return r.Runs
		}
	}
	return nil
}

// warmTTFT is the median over turns 2 and later of the per-turn p50 TTFT:
// the time to first token once the conversation is in the KV cache.
func (s convStats) warmTTFT() float64 {
	if len(s.TTFT50) < 2 {
		return math.NaN()
	}
	return median(s.TTFT50[1:])
}

// peerColumns are a row's figures in the peers table.
type peerColumns struct {
	raw, stream, ttft   float64
	one, many           *convStats
	errs                []string
	streamErr, startErr string
}

// peerRow gathers one server's figures.
func (r *report) peerRow(m modelReport, s serverReport, maxC int) peerColumns {
	pc := peerColumns{raw: math.NaN(), stream: math.NaN(), ttft: math.NaN(), startErr: s.Err}
	if e := r.Cfg.parleyEngine(s.Name); e != "" {
		if raw := m.rawFor(e); raw != nil {
			pc.raw = raw.Rate
		}
	}
	if st := s.stream(); st != nil {
		pc.stream, pc.ttft = st.Rate, st.TTFT
	}
	if s.Stream != nil {
		// With runs too: a paired server whose stream failed in a later
		// round keeps the rounds before, and the failure shows beside them.
		pc.streamErr = s.Stream.Err
	}
	pc.one, pc.many = s.conv(1), s.conv(maxC)
	for _, c := range s.Conv {
		pc.errs = append(pc.errs, c.Errors...)
	}
	return pc
}

// peerLabel names a row: Parley with its engine, or the peer.
func (r *report) peerLabel(name string) string {
	if e := r.Cfg.parleyEngine(name); e != "" {
		return "Parley, " + e + " engine"
	}
	if name == llamaServerName {
		return "llama-server " + orUnknown(r.LlamaServerVersion)
	}
	if name == "ollama" {
		return "Ollama " + orUnknown(r.OllamaVersion)
	}
	return name
}

// maxSessions is the largest -sessions value.
func (r *report) maxSessions() int {
	n := 0
	for _, c := range r.Cfg.concurrency {
		n = max(n, c)
	}
	return n
}

// hasPeers reports whether the run measured anything the table
// compares: llama-server, a second Parley engine or a second raw loop.
func (r *report) hasPeers() bool {
	if len(r.Cfg.peers.rawEngines) > 1 {
		return true
	}
	for _, s := range r.Cfg.servers {
		if s == llamaServerName || strings.HasPrefix(s, parleyOn) {
			return true
		}
	}
	return false
}

// mdPeers writes the table: per model, each engine's raw loop, then
// every server's single stream, one conversation and the most concurrent
// ones, with the targets below it.
func (r *report) mdPeers(w mdWriter) {
	if !r.hasPeers() {
		return
	}
	maxC := r.maxSessions()
	w("\n### Engines and peers\n\n")
	w("Raw loop = the engine's decode loop in-process (`llm` package, one sequence, no server); Parley's engines run with their default thread pool settings. ")
	if slices.Contains(r.Cfg.servers, llamaServerName) {
		w("llama-server (version %s, scripts/build-llama-server.sh): "+
			"`--threads %d --threads-batch %d --parallel %d --ctx-size %d --flash-attn %s`, the plain transcript as its `--chat-template-file`, its other settings at their defaults; "+
			"single stream by streamed `POST /v1/completions` with the raw prompt, conversations by streamed `POST /v1/chat/completions` with the whole history each turn. ",
			orUnknown(r.LlamaServerVersion), r.Cfg.threads, r.Cfg.threads, r.Cfg.parallel, r.Cfg.ctx*r.Cfg.parallel, r.Cfg.flashAttn)
	}
	w("Warm TTFT = median over turns 2-%d of the per-turn p50.\n\n", r.Cfg.turns)
	w("| model | server | raw loop tok/s | stream tok/s | stream / raw | stream TTFT ms | 1 conv. stream tok/s | 1 conv. warm TTFT ms | %d conv. aggregate tok/s | %d conv. stream tok/s | %d conv. warm TTFT ms | errors |\n", maxC, maxC, maxC)
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, m := range r.Models {
		for _, raw := range m.Raws {
			if st := m.rawFor(raw.Engine); st != nil {
				w("| %s | raw loop, %s engine | %s | | | %s | | | | | | |\n", m.Name, raw.Engine, f1(st.Rate), f1(st.TTFT))
			} else if raw.Err != "" {
				w("| %s | raw loop, %s engine | | | | | | | | | | %s |\n", m.Name, raw.Engine, mdEscape(short(raw.Err)))
			}
		}
		for _, s := range m.Servers {
			pc := r.peerRow(m, s, maxC)
			if pc.startErr != "" {
				w("| %s | %s | | | | | | | | | | %s |\n", m.Name, r.peerLabel(s.Name), mdEscape(short(pc.startErr)))
				continue
			}
			conv := func(c *convStats, f func(convStats) float64) string {
				if c == nil {
					return "-"
				}
				return f1(f(*c))
			}
			errs := pc.errs
			if pc.streamErr != "" {
				errs = append([]string{"stream: " + pc.streamErr}, errs...)
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.Name, r.peerLabel(s.Name), f1(pc.raw), f1(pc.stream), pct(ratio(pc.stream, pc.raw)), f1(pc.ttft),
				conv(pc.one, func(c convStats) float64 { return c.StreamRate }), conv(pc.one, convStats.warmTTFT),
				conv(pc.many, func(c convStats) float64 { return c.Aggregate }), conv(pc.many, func(c convStats) float64 { return c.StreamRate }), conv(pc.many, convStats.warmTTFT),
				mdEscape(errSummary(errs)))
		}
	}
	if lines := r.peerTargets(); len(lines) > 0 {
		w("\n#### Targets beside the peers\n\n")
		for _, line := range lines {
			w("- %s\n", line)
		}
	}
}

// peerTargets checks the targets: each Parley engine's single stream
// within 10% of its raw loop; against llama-server, the current engine's
// single stream at or ahead, and every engine's one conversation and most
// concurrent ones ahead (aggregate and stream rate) with warm TTFT ahead.
func (r *report) peerTargets() []string {
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	maxC := r.maxSessions()
	var out []string
	for _, m := range r.Models {
		ls := m.server(llamaServerName)
		lst := ls.stream()
		for _, s := range m.Servers {
			e := r.Cfg.parleyEngine(s.Name)
			if e == "" || s.Err != "" {
				continue
			}
			who := fmt.Sprintf("%s, Parley %s", m.Name, e)
			pc := r.peerRow(m, s, maxC)
			if !math.IsNaN(pc.raw) && !math.IsNaN(pc.stream) {
				x := ratio(pc.stream, pc.raw)
				out = append(out, fmt.Sprintf("%s: single stream within 10%% of the raw loop: %s (%s)", who, pct(x), mark(x >= 0.9)))
			}
			if lst == nil {
				continue
			}
			if e == llm.EngineCurrent && !math.IsNaN(pc.stream) {
				out = append(out, fmt.Sprintf("%s: single stream at or ahead of llama-server's: %s vs %s tok/s (%s)", who, f1(pc.stream), f1(lst.Rate), mark(pc.stream >= lst.Rate)))
			}
			for _, n := range slices.Compact([]int{1, maxC}) {
				pcv, lcv := s.conv(n), ls.conv(n)
				if pcv == nil || lcv == nil {
					continue
				}
				out = append(out, fmt.Sprintf("%s, %d conversation(s) vs llama-server: aggregate %s vs %s tok/s (%s), stream %s vs %s tok/s (%s), warm TTFT %s vs %s ms (%s)", who, n,
					f1(pcv.Aggregate), f1(lcv.Aggregate), mark(pcv.Aggregate > lcv.Aggregate),
					f1(pcv.StreamRate), f1(lcv.StreamRate), mark(pcv.StreamRate > lcv.StreamRate),
					f1(pcv.warmTTFT()), f1(lcv.warmTTFT()), mark(pcv.warmTTFT() < lcv.warmTTFT())))
			}
		}
	}
	return out
}
