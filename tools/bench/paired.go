package main

// Paired rounds (-paired N). On a shared or small machine the rate of one
// configuration moves by 10-20% from one minute to the next, more than the
// differences between the servers; running the servers one after another
// then ranks them by the minute each ran in. With -paired, every server of a
// model is started at once (idle servers cost no CPU), and each of N rounds
// runs every workload once on every server, one server at a time, in an order
// that rotates from round to round. The tables report the same medians as a
// sequential run, and the pairs table compares each server with the reference
// round by round, where a slow minute falls on both.

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// pairedServer is one server of a paired run: its process, its client side
// and its results, merged round after round into the sequential run's shape.
type pairedServer struct {
	name string
	p    *server
	tgt  target
	rep  serverReport
	// failed is the first failure of a workload: the server sits the later
	// workloads out, and its report keeps what it completed before (the
	// failed workload's errors are in it).
	failed string
}

// streamRound runs the round's single stream on the server and records it;
// a server that failed before sits the rounds out.
func (s *pairedServer) streamRound(ctx context.Context, cfg config, round int) {
	if s.failed != "" {
		return
	}
	r, err := streamOnce(ctx, s.tgt, fmt.Sprintf(streamPrompt, character(round)), cfg.streamTokens, cfg.seed)
	if err != nil {
		s.rep.Stream.Err, s.failed = err.Error(), fmt.Sprintf("round %d: stream: %v", round+1, err)
		return
	}
	s.rep.Stream.Runs = append(s.rep.Stream.Runs, r)
}

// report is the server's report at the end of the run. A server that
// failed with nothing completed gets the failure as its error, which its
// rows print instead of figures; one that failed later keeps the rounds
// before, and the failed workload's errors show in their column.
func (s *pairedServer) report() serverReport {
	r := s.rep
	if s.failed != "" && (r.Stream == nil || len(r.Stream.Runs) == 0) && len(r.Conv) == 0 {
		r.Err = s.failed
	}
	return r
}

// pairedRaw is a raw decode loop of a paired run: in each round it decodes
// the round's stream prompt beside the servers' streams.
type pairedRaw struct {
	loop *rawLoop
	res  rawResult
}

func (r *pairedRaw) streamRound(ctx context.Context, _ config, round int) {
	if r.res.Err != "" {
		return
	}
	t, err := r.loop.once(ctx, round)
	if err != nil {
		r.res.Err = fmt.Sprintf("round %d: %v", round+1, err)
		return
	}
	r.res.Runs = append(r.res.Runs, t)
}

// streamer is what runs a round's single stream: a server or a raw loop.
type streamer interface {
	streamRound(ctx context.Context, cfg config, round int)
}

// startPaired starts the server name and warms it up.
func startPaired(ctx context.Context, cfg config, name string, sc serverConfig, logf func(string, ...any)) (*pairedServer, string, error) {
	sc, err := sc.forServer(name)
	if err != nil {
		return nil, "", err
	}
	p, tgt, version, err := startTarget(ctx, cfg, name, sc, logf)
	if err != nil {
		return nil, version, err
	}
	wctx, wcancel := context.WithTimeout(ctx, cfg.workloadTimeout)
	defer wcancel()
	if err := warmup(wctx, tgt, cfg.seed); err != nil {
		tgt.Close()
		p.stop(15 * time.Second)
		return nil, version, fmt.Errorf("warm-up: %w", err)
	}
	return &pairedServer{name: name, p: p, tgt: tgt, rep: serverReport{Name: name, Stream: &streamResult{}}}, version, nil
}

// runPaired measures every server of cfg.servers on one model in cfg.paired
// rounds (see the top of this file), and the raw decode loops of -raw-engines
// unless -raw=false, which decode each round's stream prompt in this process
// beside the servers' streams. Rounds are aligned across servers: the r-th
// stream run and the r-th block of each conversation workload's sessions of
// every server come from round r. A server whose workload fails drops out of
// the later rounds, keeping what it measured.
func runPaired(ctx context.Context, cfg config, sc serverConfig, logf func(string, ...any)) ([]serverReport, []rawResult, map[string]string) {
	model := strings.TrimSuffix(filepath.Base(sc.model), ".gguf")
	versions := map[string]string{}
	var (
		live    []*pairedServer
		raws    []*pairedRaw
		reports []serverReport
	)
	defer func() {
		for _, s := range live {
			s.tgt.Close()
			s.p.stop(15 * time.Second)
		}
		for _, r := range raws {
			if r.loop != nil {
				r.loop.eng.Close()
			}
		}
	}()
	for _, engine := range cfg.peers.rawEngines {
		if !cfg.raw {
			break
		}
		loop, res := openRaw(sc.model, engine, cfg.peers.engineLib, cfg.ctx, cfg.threads, cfg.flashAttn, gpuLayers(cfg.gpuLayers), cfg.streamTokens, cfg.seed)
		if loop != nil {
			if err := loop.warm(ctx); err != nil {
				res.Err = fmt.Sprintf("warm-up: %v", err)
			}
		}
		raws = append(raws, &pairedRaw{loop: loop, res: res}) // its error is logged at the end
	}
	for _, name := range cfg.servers {
		s, version, err := startPaired(ctx, cfg, name, sc, logf)
		versions[name] = version
		if err != nil {
			logf("%s: %s: %v", model, name, err)
			reports = append(reports, serverReport{Name: name, Err: err.Error()})
			continue
		}
		live = append(live, s)
	}
	perRound := 0
	for _, n := range cfg.concurrency {
		perRound += n
	}
	var streamers []streamer
	for _, s := range live {
		streamers = append(streamers, s)
	}
	for _, r := range raws {
		streamers = append(streamers, r)
	}
	for round := range cfg.paired {
		if ctx.Err() != nil || len(live) == 0 {
			break
		}
		for _, s := range rotate(streamers, round) {
			wctx, wcancel := context.WithTimeout(ctx, cfg.workloadTimeout)
			s.streamRound(wctx, cfg, round)
			wcancel()
		}
		order := rotate(live, round)
		first := round * perRound // sessions are numbered across rounds: no two send the same prompts
		for _, n := range cfg.concurrency {
			for _, s := range order {
				if s.failed != "" {
					continue
				}
				wctx, wcancel := context.WithTimeout(ctx, cfg.workloadTimeout)
				c := runConversations(wctx, s.tgt, first, n, cfg.turns, cfg.replyTokens, cfg.seed)
				wcancel()
				s.rep.addRound(c)
				if len(c.Errors) > 0 { // logged at the end
					s.failed = fmt.Sprintf("round %d: %d sessions: %s", round+1, n, errSummary(c.Errors))
				}
			}
			first += n
		}
		var line []string
		for _, s := range live {
			if k := len(s.rep.Stream.Runs); k == round+1 {
				line = append(line, fmt.Sprintf("%s %.1f tok/s", s.name, s.rep.Stream.Runs[k-1].rate()))
			}
		}
		for _, r := range raws {
			if k := len(r.res.Runs); k == round+1 {
				line = append(line, fmt.Sprintf("raw %s %.1f tok/s", r.res.Engine, r.res.Runs[k-1].rate()))
			}
		}
		logf("%s: round %d of %d: stream %s", model, round+1, cfg.paired, strings.Join(line, ", "))
	}
	for _, s := range live {
		if err := s.p.exited(); err != nil && s.failed == "" {
			s.failed = err.Error()
		}
		if s.failed != "" {
			logf("%s: %s: %s (it sat out the rest of the run)", model, s.name, s.failed)
		}
		reports = append(reports, s.report())
	}
	var rawResults []rawResult
	for _, r := range raws {
		if r.res.Err != "" {
			logf("%s: raw decode (%s): %s", model, r.res.Engine, r.res.Err)
		}
		rawResults = append(rawResults, r.res)
	}
	// The servers' order is -servers' order, as in a sequential run.
	slices.SortStableFunc(reports, func(a, b serverReport) int {
		return slices.Index(cfg.servers, a.Name) - slices.Index(cfg.servers, b.Name)
	})
	return reports, rawResults, versions
}

// rotate is the round's order of the servers: each goes first in turn.
func rotate[T any](xs []T, round int) []T {
	k := round % max(len(xs), 1)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}

// addRound appends one round's conversation workload to the result of the
// same number of sessions: its sessions after the earlier rounds' and its
// wall time to theirs (so the aggregate is all tokens over all the time
// the workload ran).
func (s *serverReport) addRound(c concResult) {
	for i := range s.Conv {
		if s.Conv[i].Sessions == c.Sessions {
			m := &s.Conv[i]
			m.Turns = append(m.Turns, c.Turns...)
			m.Wall += c.Wall
			m.Walls = append(m.Walls, c.Wall)
			m.RoundErrors = append(m.RoundErrors, len(c.Errors))
			m.Errors = append(m.Errors, c.Errors...)
			return
		}
	}
	c.Walls, c.RoundErrors = []time.Duration{c.Wall}, []int{len(c.Errors)}
	s.Conv = append(s.Conv, c)
}

// round is the r-th round of a paired conversation workload, nil when the
// server has none; failed says whether that round had errors.
func (c concResult) round(r int) (rc *concResult, failed bool) {
	lo, hi := r*c.Sessions, (r+1)*c.Sessions
	if r >= len(c.Walls) || hi > len(c.Turns) {
		return nil, false
	}
	return &concResult{Sessions: c.Sessions, Turns: c.Turns[lo:hi], Wall: c.Walls[r]}, r < len(c.RoundErrors) && c.RoundErrors[r] > 0
}

// pairStats compares a server with the reference over the rounds both
// completed: the median of the per-round ratios (server / reference) and in
// how many rounds the server came out ahead (a higher rate, a lower TTFT).
type pairStats struct {
	N        int
	Ratio    float64
	Wins     int
	Min, Max float64 // the lowest and highest per-round ratio
}

func pairUp(a, b []float64, higherWins bool) pairStats {
	var st pairStats
	var ratios []float64
	for i := range min(len(a), len(b)) {
		if a[i] <= 0 || b[i] <= 0 || math.IsNaN(a[i]) || math.IsNaN(b[i]) {
			continue
		}
		ratios = append(ratios, a[i]/b[i])
		if (a[i] > b[i]) == higherWins && a[i] != b[i] {
			st.Wins++
		}
	}
	st.N, st.Ratio = len(ratios), median(ratios)
	if st.N > 0 {
		st.Min, st.Max = slices.Min(ratios), slices.Max(ratios)
	}
	return st
}

// roundFigures is one figure of a server per round.
type roundFigures struct {
	streamRate, streamTTFT []float64
	oneRate, oneWarm       []float64 // one conversation: median rate over its turns, warm TTFT
	manyAgg, manyWarm      []float64 // the largest -sessions workload: aggregate, warm TTFT
}

func (s *serverReport) roundFigures(maxC int) roundFigures {
	var f roundFigures
	if s.Stream != nil {
		f.streamRate = rates(s.Stream.Runs)
		for _, r := range s.Stream.Runs {
			f.streamTTFT = append(f.streamTTFT, ms(r.TTFT))
		}
	}
	for _, c := range s.Conv {
		for r := 0; ; r++ {
			rc, failed := c.round(r)
			if rc == nil {
				break
			}
			st := summarizeConv(*rc)
			if failed { // a round cut short by errors is no figure: pairUp skips NaN, the rounds stay aligned
				st.StreamRate, st.Aggregate, st.TTFT50 = math.NaN(), math.NaN(), nil
			}
			switch c.Sessions {
			case 1:
				f.oneRate, f.oneWarm = append(f.oneRate, st.StreamRate), append(f.oneWarm, st.warmTTFT())
			case maxC:
				f.manyAgg, f.manyWarm = append(f.manyAgg, st.Aggregate), append(f.manyWarm, st.warmTTFT())
			}
		}
	}
	return f
}

// rates are the client-side decode rates of runs.
func rates(runs []turnResult) []float64 {
	var xs []float64
	for _, r := range runs {
		xs = append(xs, r.rate())
	}
	return xs
}

// pairedReference is the server the pairs table compares the others with:
// llama-server when it ran, else the last server of -servers.
func (r *report) pairedReference() string {
	if slices.Contains(r.Cfg.servers, llamaServerName) {
		return llamaServerName
	}
	return r.Cfg.servers[len(r.Cfg.servers)-1]
}

// pairedRow is one server's comparison with the reference: stream rate,
// stream TTFT, one conversation's rate and warm TTFT, the largest workload's
// aggregate and warm TTFT.
type pairedRow struct {
	model, server string
	cells         [6]pairStats
	raw           pairStats // a Parley server's stream over its engine's raw loop, round by round
}

func (r *report) pairedRows() (ref string, rows []pairedRow) {
	if r.Cfg.paired == 0 || len(r.Cfg.servers) < 2 {
		return "", nil
	}
	ref, maxC := r.pairedReference(), r.maxSessions()
	for _, m := range r.Models {
		rs := m.server(ref)
		if rs == nil {
			continue
		}
		rf := rs.roundFigures(maxC)
		for i := range m.Servers {
			s := &m.Servers[i]
			if s.Name == ref {
				continue
			}
			f := s.roundFigures(maxC)
			raw := pairUp(f.streamRate, rates(m.rawRuns(r.Cfg.parleyEngine(s.Name))), true)
			rows = append(rows, pairedRow{model: m.Name, server: s.Name, raw: raw, cells: [6]pairStats{
				pairUp(f.streamRate, rf.streamRate, true), pairUp(f.streamTTFT, rf.streamTTFT, false),
				pairUp(f.oneRate, rf.oneRate, true), pairUp(f.oneWarm, rf.oneWarm, false),
				pairUp(f.manyAgg, rf.manyAgg, true), pairUp(f.manyWarm, rf.manyWarm, false)}})
		}
	}
	return ref, rows
}

func (p pairStats) String() string {
	if p.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s, %d/%d", f2(p.Ratio), p.Wins, p.N)
}

// spread is p as its median ratio and range over rounds.
func (p pairStats) spread() string {
	if p.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s-%s)", f2(p.Ratio), f2(p.Min), f2(p.Max))
}

// pairedLines are the pairs table for the terminal.
func (r *report) pairedLines() []string {
	ref, rows := r.pairedRows()
	var lines []string
	for _, row := range rows {
		c := row.cells
		line := fmt.Sprintf("paired, %s %s / %s (median ratio, rounds ahead): stream %v, TTFT %v; 1 conv. %v, warm TTFT %v", row.model, row.server, ref, c[0], c[1], c[2], c[3])
		if maxC := r.maxSessions(); maxC > 1 {
			line += fmt.Sprintf("; %d conv. aggregate %v, warm TTFT %v", maxC, c[4], c[5])
		}
		lines = append(lines, line+"; stream / own raw loop "+row.raw.spread())
	}
	return lines
}

// mdPaired writes the pairs table of a -paired run (without the columns of
// the largest -sessions workload when that is one conversation).
func (r *report) mdPaired(w mdWriter) {
	ref, rows := r.pairedRows()
	if ref == "" {
		return
	}
	maxC := r.maxSessions()
	w("\n### Paired rounds against %s\n\n", r.peerLabel(ref))
	w("%d rounds; in each, every workload ran once on every server, one server at a time, the order rotating from round to round (the tables above summarize the same runs). "+
		"Each cell: the median over rounds of the server's figure divided by %s's in the same round, then in how many rounds the server was ahead (a higher rate, a lower TTFT). "+
		"Warm TTFT = median over turns 2-%d. Last column: a Parley server's stream rate over its engine's raw loop (in this process, the same prompt in the same round), median (range) over rounds.\n\n", r.Cfg.paired, r.peerLabel(ref), r.Cfg.turns)
	head, rule := "| model | server | stream tok/s | stream TTFT | 1 conv. stream tok/s | 1 conv. warm TTFT |", "|---|---|---:|---:|---:|---:|"
	if maxC > 1 {
		head += fmt.Sprintf(" %d conv. aggregate tok/s | %d conv. warm TTFT |", maxC, maxC)
		rule += "---:|---:|"
	}
	w("%s stream / own raw loop |\n%s---:|\n", head, rule)
	for _, row := range rows {
		c := row.cells
		w("| %s | %s | %v | %v | %v | %v |", row.model, r.peerLabel(row.server), c[0], c[1], c[2], c[3])
		if maxC > 1 {
			w(" %v | %v |", c[4], c[5])
		}
		w(" %s |\n", row.raw.spread())
	}
}
