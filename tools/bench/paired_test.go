package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

func TestRotate(t *testing.T) {
	xs := []string{"a", "b", "c"}
	for round, want := range [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}, {"a", "b", "c"}} {
		if got := rotate(xs, round); !slices.Equal(got, want) {
			t.Errorf("round %d: %v, want %v", round, got, want)
		}
	}
	if !slices.Equal(xs, []string{"a", "b", "c"}) {
		t.Errorf("rotate changed its input: %v", xs)
	}
}

// TestAddRoundAndRound merges rounds of a conversation workload and takes
// them apart again.
func TestAddRoundAndRound(t *testing.T) {
	turn := func(tokens int) []turnResult { return []turnResult{{Tokens: tokens, Decode: time.Second}} }
	var s serverReport
	s.addRound(concResult{Sessions: 2, Turns: [][]turnResult{turn(3), turn(5)}, Wall: 2 * time.Second})
	s.addRound(concResult{Sessions: 1, Turns: [][]turnResult{turn(7)}, Wall: time.Second})
	s.addRound(concResult{Sessions: 2, Turns: [][]turnResult{turn(11), turn(13)}, Wall: 4 * time.Second, Errors: []string{"x"}})
	if len(s.Conv) != 2 {
		t.Fatalf("%d workloads, want 2 (one per number of sessions)", len(s.Conv))
	}
	two := s.Conv[0]
	if two.Sessions != 2 || len(two.Turns) != 4 || two.Wall != 6*time.Second || !slices.Equal(two.Walls, []time.Duration{2 * time.Second, 4 * time.Second}) || len(two.Errors) != 1 {
		t.Fatalf("merged: %+v", two)
	}
	if st := summarizeConv(two); st.Tokens != 32 || st.Aggregate != 32.0/6 {
		t.Errorf("merged aggregate %v over %d tokens, want all tokens over all the wall time", st.Aggregate, st.Tokens)
	}
	if !slices.Equal(two.RoundErrors, []int{0, 1}) {
		t.Errorf("errors by round %v, want [0 1]", two.RoundErrors)
	}
	if r0, failed := two.round(0); r0 == nil || failed {
		t.Errorf("round 0: %+v, failed %v", r0, failed)
	}
	r1, failed := two.round(1)
	if r1 == nil || r1.Wall != 4*time.Second || len(r1.Turns) != 2 || r1.Turns[0][0].Tokens != 11 || !failed {
		t.Errorf("round 1: %+v, failed %v (want the round with the error)", r1, failed)
	}
	if r, _ := two.round(2); r != nil {
		t.Error("a round past the last one")
	}
	if r, _ := s.Conv[1].round(1); r != nil {
		t.Error("a round past the last one")
	}
}

// TestPairedFailure: a server whose workload fails in a later round keeps
// the rounds it completed, and the failed round is no pair; a server that
// completed nothing reports the failure as its error.
func TestPairedFailure(t *testing.T) {
	turns := func(n int, decode time.Duration) [][]turnResult {
		var ts [][]turnResult
		for range n {
			ts = append(ts, []turnResult{{Tokens: 10, Decode: decode, TTFT: 10 * time.Millisecond}, {Tokens: 10, Decode: decode, TTFT: 20 * time.Millisecond}})
		}
		return ts
	}
	ok := pairedServer{name: "parley-current", rep: serverReport{Name: "parley-current", Stream: &streamResult{}}}
	bad := pairedServer{name: llamaServerName, rep: serverReport{Name: llamaServerName, Stream: &streamResult{}}}
	for round := range 3 {
		ok.rep.addRound(concResult{Sessions: 2, Turns: turns(2, time.Second), Wall: 2 * time.Second})
		if round < 2 {
			c := concResult{Sessions: 2, Turns: turns(2, 2*time.Second), Wall: 4 * time.Second}
			if round == 1 { // crashed half-way: its rate would look like anything
				c.Turns, c.Wall, c.Errors = turns(2, 10*time.Millisecond)[:1], time.Second, []string{"session 3 turn 2: unexpected EOF"}
				c.Turns = append(c.Turns, nil)
				bad.failed = "round 2: 2 sessions: 1 errors"
			}
			bad.rep.addRound(c)
		}
	}
	rep := bad.report()
	if rep.Err != "" || len(rep.Conv) != 1 || len(rep.Conv[0].Errors) != 1 {
		t.Fatalf("failed in round 2: %+v, want the rounds kept, no server error, the workload's error", rep)
	}
	okRep := ok.report()
	fa, fb := okRep.roundFigures(2), rep.roundFigures(2)
	if len(fb.manyAgg) != 2 || !math.IsNaN(fb.manyAgg[1]) || math.IsNaN(fb.manyAgg[0]) {
		t.Fatalf("llama-server's aggregate by round %v, want round 1's figure and no figure for round 2", fb.manyAgg)
	}
	if p := pairUp(fa.manyAgg, fb.manyAgg, true); p.N != 1 || p.Ratio != 2 {
		t.Errorf("aggregate pairs %+v, want round 1 alone (ratio 2)", p)
	}
	if p := pairUp(fa.manyWarm, fb.manyWarm, false); p.N != 1 {
		t.Errorf("warm TTFT pairs %+v, want round 1 alone", p)
	}

	none := pairedServer{name: llamaServerName, rep: serverReport{Name: llamaServerName, Stream: &streamResult{Err: "refused"}}, failed: "round 1: stream: refused"}
	if rep := none.report(); rep.Err != "round 1: stream: refused" {
		t.Errorf("nothing completed: error %q, want the failure", rep.Err)
	}
}

func TestPairUp(t *testing.T) {
	// Rates: higher wins. Round 2 has no figure on one side and is skipped.
	p := pairUp([]float64{110, 90, 0, 120}, []float64{100, 100, 100, 100}, true)
	if p.N != 3 || p.Wins != 2 || p.Ratio != 1.1 || p.Min != 0.9 || p.Max != 1.2 {
		t.Errorf("rates: %+v, want 3 pairs, 2 ahead, median ratio 1.1 in 0.9-1.2", p)
	}
	if got := p.spread(); got != "1.10 (0.90-1.20)" {
		t.Errorf("spread %q", got)
	}
	// TTFT: lower wins; a tie wins nothing.
	p = pairUp([]float64{50, 100, 200}, []float64{100, 100, 100}, false)
	if p.N != 3 || p.Wins != 1 || p.Ratio != 1 {
		t.Errorf("TTFT: %+v, want 3 pairs, 1 ahead, median ratio 1", p)
	}
	if p := pairUp(nil, []float64{1}, true); p.N != 0 || p.String() != "-" {
		t.Errorf("no pairs: %+v %q", p, p.String())
	}
}

// TestPairedEndToEnd runs -paired with both of Parley's engines on
// stories260K: both servers up at once, every workload once per round on
// each, the rounds merged into the usual tables and compared in the pairs
// table.
func TestPairedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs servers")
	}
	dir := t.TempDir()
	out, js := filepath.Join(dir, "BENCHMARKS.md"), filepath.Join(dir, "bench.json")
	args := []string{
		"-parley", testbin.Parley(t), "-servers", "parley-embedded,parley-current", "-raw-engines", "embedded,current", "-paired", "3",
		"-models", testmodel.Path(t), "-threads", "2", "-parallel", "2", "-ctx", "512",
		"-stream-tokens", "16", "-reply-tokens", "8", "-turns", "2", "-sessions", "1,2",
		"-timeout", "40m", "-workload-timeout", "20m", "-out", out, "-json", js, "-scratch", filepath.Join(dir, "scratch"),
	}
	stdout, stderr := runTool(t, args)
	// Every round ran every server before the next round began, the first
	// server rotating.
	var starts []string
	for _, line := range strings.Split(stderr, "\n") {
		if _, after, ok := strings.Cut(line, ": round "); ok {
			starts = append(starts, after)
		}
	}
	if len(starts) != 3 {
		t.Errorf("%d rounds logged, want 3:\n%s", len(starts), stderr)
	}

	var rep struct {
		Models []struct {
			Raws    []rawResult
			Servers []serverReport
		}
	}
	b := readJSON(t, js, &rep)
	if len(rep.Models) != 1 || len(rep.Models[0].Servers) != 2 {
		t.Fatalf("report: %s", b)
	}
	// Each raw loop decoded every round's stream prompt, the same reply as
	// the servers' (below).
	if got := len(rep.Models[0].Raws); got != 2 {
		t.Fatalf("%d raw loops, want 2", got)
	}
	for _, raw := range rep.Models[0].Raws {
		if raw.Err != "" || len(raw.Runs) != 3 {
			t.Fatalf("raw loop %s: %d runs, error %q", raw.Engine, len(raw.Runs), raw.Err)
		}
	}
	var streams [][]turnResult
	for i, s := range rep.Models[0].Servers {
		if want := []string{"parley-embedded", "parley-current"}[i]; s.Name != want || s.Err != "" {
			t.Fatalf("server %d: %s (%s), want %s without an error", i, s.Name, s.Err, want)
		}
		if s.Stream == nil || len(s.Stream.Runs) != 3 || len(s.Conv) != 2 {
			t.Fatalf("%s: %+v", s.Name, s)
		}
		streams = append(streams, s.Stream.Runs)
		for _, c := range s.Conv {
			if len(c.Errors) > 0 || len(c.Turns) != 3*c.Sessions || len(c.Walls) != 3 {
				t.Fatalf("%s %d sessions: %d sessions' turns, %d rounds' walls, errors %v", s.Name, c.Sessions, len(c.Turns), len(c.Walls), c.Errors)
			}
			for i, sess := range c.Turns {
				if len(sess) != 2 || sess[1].CachedTokens <= 0 {
					t.Errorf("%s session %d of %d: %+v", s.Name, i, len(c.Turns), sess)
				}
			}
		}
	}
	// Round r's stream has the same prompt on both servers (and greedy
	// decoding on both engines gives the same reply), and another prompt
	// than the other rounds'.
	for r := range 3 {
		a, c := streams[0][r], streams[1][r]
		if a.PromptTokens != c.PromptTokens || a.Tokens != c.Tokens {
			t.Errorf("round %d: embedded %d prompt / %d reply tokens, current %d / %d", r, a.PromptTokens, a.Tokens, c.PromptTokens, c.Tokens)
		}
		for _, raw := range rep.Models[0].Raws {
			if raw.Runs[r].PromptTokens != a.PromptTokens || raw.Runs[r].Tokens != a.Tokens {
				t.Errorf("round %d: raw loop (%s) %d prompt / %d reply tokens, the servers %d / %d", r, raw.Engine, raw.Runs[r].PromptTokens, raw.Runs[r].Tokens, a.PromptTokens, a.Tokens)
			}
		}
		if r > 0 && a.CachedTokens >= a.PromptTokens {
			t.Errorf("round %d: the whole prompt (%d tokens) was cached: not a fresh prompt", r, a.PromptTokens)
		}
	}

	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Paired rounds against Parley, current engine", "| stories260K | Parley, embedded engine | ", "median of 3 paired rounds", "/3 | ", "| 2 conv. warm TTFT | stream / own raw loop |"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(stdout, "paired, stories260K parley-embedded / parley-current") {
		t.Errorf("no pairs line on stdout:\n%s", stdout)
	}
}

// TestPairedTableOneSession: with -sessions 1 the pairs table has no
// columns for a larger workload, and every row has as many cells as its
// header.
func TestPairedTableOneSession(t *testing.T) {
	run := func(rate float64) turnResult {
		return turnResult{Tokens: 11, Decode: time.Duration(10 / rate * float64(time.Second)), TTFT: 100 * time.Millisecond}
	}
	server := func(name string, rates ...float64) serverReport {
		s := serverReport{Name: name, Stream: &streamResult{}}
		for _, r := range rates {
			s.Stream.Runs = append(s.Stream.Runs, run(r))
			s.addRound(concResult{Sessions: 1, Turns: [][]turnResult{{run(r), run(r)}}, Wall: time.Second})
		}
		return s
	}
	r := &report{Cfg: config{paired: 2, servers: []string{"parley-current", llamaServerName}, concurrency: []int{1}, turns: 2},
		Models: []modelReport{{Name: "m", Servers: []serverReport{server("parley-current", 110, 90), server(llamaServerName, 100, 100)}}}}
	var b strings.Builder
	r.mdPaired(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	md := b.String()
	if strings.Contains(md, "conv. aggregate") {
		t.Errorf("a larger workload's columns with -sessions 1:\n%s", md)
	}
	var rows []string
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "|") {
			rows = append(rows, line)
		}
	}
	if len(rows) != 3 {
		t.Fatalf("%d table lines, want header, rule and one row:\n%s", len(rows), md)
	}
	for _, row := range rows {
		if got, want := strings.Count(row, "|"), strings.Count(rows[0], "|"); got != want {
			t.Errorf("%d cells' bars in %q, the header has %d", got, row, want)
		}
	}
	// Ratios 1.1 and 0.9: the nearest-rank median of two is the lower one;
	// ahead in one round of two.
	if !strings.Contains(rows[2], "| 0.90, 1/2 |") {
		t.Errorf("row %q", rows[2])
	}
}
