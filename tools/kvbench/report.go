package main

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/parley-chat/parley/tools/internal/harness"
)

type results struct {
	cfg     config
	conv    []convResult
	restart *restartResult
	took    time.Duration
}

// later returns the turns after the first.
func (r convResult) later() []turnResult {
	var out []turnResult
	for _, t := range r.turns {
		if t.turn > 1 {
			out = append(out, t)
		}
	}
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }

// figures returns, over turns 2 and later: the mean evaluated and new
// tokens, the share of turns that evaluated at most their new tokens + 2,
// and TTFT p50/p95; and TTFT p50/p95 over every turn.
func (r convResult) figures() (eval, newTok, within float64, p50, p95, all50, all95 time.Duration) {
	later := r.later()
	var ttfts, all []time.Duration
	ok := 0
	for _, t := range later {
		eval += float64(t.evaluated())
		newTok += float64(t.newTokens)
		if t.evaluated() <= t.newTokens+2 {
			ok++
		}
		ttfts = append(ttfts, t.ttft)
	}
	for _, t := range r.turns {
		all = append(all, t.ttft)
	}
	if n := float64(len(later)); n > 0 {
		eval, newTok, within = eval/n, newTok/n, float64(ok)/n
	}
	return eval, newTok, within, harness.Percentile(ttfts, 50), harness.Percentile(ttfts, 95), harness.Percentile(all, 50), harness.Percentile(all, 95)
}

func (r convResult) summary() string {
	eval, newTok, within, p50, p95, _, _ := r.figures()
	return fmt.Sprintf("%d turns in %s; turns 2+: evaluated %.1f tokens per turn (new %.1f), %.0f%% within new+2, TTFT p50 %s p95 %s",
		len(r.turns), r.took.Round(time.Second), eval, newTok, 100*within, ms(p50), ms(p95))
}

func (res results) markdown() string {
	c := res.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "## KV swap: measured\n\n")
	fmt.Fprintf(&b, "- Date: %s (the whole run took %s)\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), res.took.Round(time.Second))
	fmt.Fprintf(&b, "- Machine: %d CPUs, shared with other work (figures are noisy: compare the two columns, taken minutes apart)\n", runtime.NumCPU())
	fmt.Fprintf(&b, "- Server: `bin/parley --parallel %d --threads %d --ctx %d --max-tokens %d --temperature 0 --store bolt`, swap on: `%s`, off: `%s`\n",
		c.parallel, c.threads, c.ctx, c.replyTokens, strings.Join(c.swapArgs, " "), strings.Join(c.noSwapArgs, " "))
	fmt.Fprintf(&b, "- Command: `go run ./tools/kvbench -conversations %d -turns %d -parallel %d -threads %d -reply-tokens %d -long-tokens %d`\n\n",
		c.conversations, c.turns, c.parallel, c.threads, c.replyTokens, c.longTokens)
	if len(res.conv) > 0 {
		fmt.Fprintf(&b, "### %d conversations x %d turns, all at once, over %d slots\n\n", c.conversations, c.turns, c.parallel)
		b.WriteString("| |")
		for _, r := range res.conv {
			fmt.Fprintf(&b, " swap %s |", map[bool]string{true: "on", false: "off"}[r.swap])
		}
		b.WriteString("\n|---|" + strings.Repeat("---:|", len(res.conv)) + "\n")
		row := func(name string, f func(convResult) string) {
			fmt.Fprintf(&b, "| %s |", name)
			for _, r := range res.conv {
				fmt.Fprintf(&b, " %s |", f(r))
			}
			b.WriteString("\n")
		}
		row("wall time", func(r convResult) string { return r.took.Round(time.Second).String() })
		row("prompt tokens evaluated per turn, turns 2+ (mean)", func(r convResult) string {
			e, _, _, _, _, _, _ := r.figures()
			return fmt.Sprintf("%.1f", e)
		})
		row("new tokens per turn, turns 2+ (mean)", func(r convResult) string {
			_, n, _, _, _, _, _ := r.figures()
			return fmt.Sprintf("%.1f", n)
		})
		row("turns 2+ evaluating at most their new tokens + 2", func(r convResult) string {
			_, _, w, _, _, _, _ := r.figures()
			return fmt.Sprintf("%.1f%%", 100*w)
		})
		row("TTFT p50 / p95, turns 2+", func(r convResult) string {
			_, _, _, p50, p95, _, _ := r.figures()
			return ms(p50) + " / " + ms(p95)
		})
		row("TTFT p50 / p95, all turns", func(r convResult) string {
			_, _, _, _, _, a50, a95 := r.figures()
			return ms(a50) + " / " + ms(a95)
		})
		row("prompt tokens evaluated in all", func(r convResult) string {
			return fmt.Sprintf("%.0f", r.stats["parley_prompt_tokens_evaluated_total"])
		})
		row("states saved / restored", func(r convResult) string {
			return fmt.Sprintf("%.0f / %.0f", r.stats["parley_kv_saves_total"], r.stats["parley_kv_restores_total"])
		})
		row("saved MiB / time saving, restoring", func(r convResult) string {
			return fmt.Sprintf("%.0f / %.2f s, %.2f s", r.stats["parley_kv_saved_bytes_total"]/(1<<20),
				r.stats["parley_kv_save_seconds_total"], r.stats["parley_kv_restore_seconds_total"])
		})
		b.WriteString("\n")
	}
	if r := res.restart; r != nil {
		fmt.Fprintf(&b, "### One %d-token conversation: the next turn after kill -9 and a restart\n\n", r.historyTokens)
		fmt.Fprintf(&b, "Built in %s on a server with the swap on, killed with SIGKILL once its state was on disk; then "+
			"%d restarts each way from copies of that data directory, one turn each (TTFT of each run, median in bold).\n\n", r.build.Round(time.Second), len(r.warm))
		fmt.Fprintf(&b, "| | TTFT (median) | runs | prompt tokens evaluated |\n|---|---:|---|---:|\n")
		runs := func(ds []time.Duration) string {
			var s []string
			for _, d := range ds {
				s = append(s, ms(d))
			}
			return strings.Join(s, ", ")
		}
		fmt.Fprintf(&b, "| restored from `--data-dir/kvcache` | **%s** | %s | %d (%d restored) |\n", ms(harness.Percentile(r.warm, 50)), runs(r.warm), r.warmEval, r.warmCached)
		fmt.Fprintf(&b, "| cold (no files: the whole history evaluated) | **%s** | %s | %d |\n", ms(harness.Percentile(r.cold, 50)), runs(r.cold), r.coldEval)
		if cold := harness.Percentile(r.cold, 50); cold > 0 {
			fmt.Fprintf(&b, "\nRestored TTFT is %.0f%% of the cold figure.\n", 100*float64(harness.Percentile(r.warm, 50))/float64(cold))
		}
	}
	return b.String()
}
