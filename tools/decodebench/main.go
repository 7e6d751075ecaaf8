// Command decodebench measures the llm package's decode loop in-process, no
// server: greedy tokens per second for one stream and for N concurrent
// sequences, and the CPU time the process burns while idle after them (the
// cost of the thread pool's polling). It is the quick, targeted companion
// of tools/bench, for before/after figures on one knob at a time:
//
//	go run ./tools/decodebench -model ~/.cache/parley/models/synthetic-smollm2-135m-f16.gguf -threads 2 -poll 50
//	go run ./tools/decodebench ... -no-pool          # ggml's throwaway pool per step
//	go run ./tools/decodebench ... -cpuprofile cpu.out
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() {
	if llm.GPUProbeChild(os.Getenv) {
		// This process is the current engine's GPU probe (the raw loop on a GPU starts it).
		os.Exit(llm.ServeGPUProbe(os.Getenv))
	}
	harness.Main("decodebench", func(ctx context.Context, args []string, stdout io.Writer) error {
		return run(ctx, args, stdout, os.Stderr)
	})
}

type config struct {
	cfg      llm.Config
	sessions []int
	tokens   int
	depth    int
	repeats  int
	idle     time.Duration
	profile  string
	quantize string // "": measure; q4_0 or q8_0: write a quantized copy of -model to -o
	out      string
	copyPre  int    // > 0: measure the copy of a prefix this long from another slot instead
	huge     int    // > 0: compare the weights on huge pages with the file mapped, this many rounds
	sampling string // "greedy" or "default" (parley.DefaultParams: what a client that sets nothing gets)
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var sessions string
	fs := flag.NewFlagSet("decodebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.cfg.Path, "model", "", "GGUF file")
	fs.StringVar(&c.cfg.Engine, "engine", "embedded", "engine: embedded, current or auto")
	fs.IntVar(&c.cfg.Threads, "threads", max(1, runtime.NumCPU()/2), "CPU threads")
	fs.IntVar(&c.cfg.ContextLength, "ctx", 1024, "context tokens per sequence")
	fs.StringVar(&c.cfg.FlashAttention, "flash-attn", "off", "flash attention: off, on, auto")
	fs.IntVar(&c.cfg.Poll, "poll", llm.DefaultPoll, "thread pool polling level, 0 to 100")
	fs.StringVar(&c.cfg.HugePages, "huge-pages", llm.HugePagesAuto, "weights on huge pages (auto) or mapped from the file (off)")
	fs.BoolVar(&c.cfg.NoThreadPool, "no-pool", false, "no persistent thread pool (ggml's throwaway pool per step)")
	fs.StringVar(&sessions, "sessions", "1,8", "comma-separated numbers of concurrent sequences")
	fs.IntVar(&c.tokens, "tokens", 128, "tokens generated per sequence")
	fs.IntVar(&c.depth, "depth", 0, "context already in the KV cache when decoding starts: each sequence's prompt is this many tokens, and the rate counts from the first token (a conversation's later turns decode at depth)")
	fs.IntVar(&c.repeats, "repeats", 3, "runs per number of sequences (the best and the median are printed)")
	fs.DurationVar(&c.idle, "idle", 0, "after the runs, measure the process's CPU time over this much idle time")
	fs.StringVar(&c.profile, "cpuprofile", "", "write a Go CPU profile of the runs to this file")
	fs.StringVar(&c.quantize, "quantize", "", "instead of measuring, write a copy of -model quantized to q4_0 or q8_0 into -o")
	fs.StringVar(&c.out, "o", "", "output GGUF of -quantize")
	fs.IntVar(&c.cfg.Parallel, "parallel", 0, "KV-cache slots of the context (default: the largest -sessions)")
	fs.StringVar(&c.cfg.KVUnified, "kv-unified", "off", "one KV buffer for all slots (on) or one per slot (off)")
	fs.StringVar(&c.sampling, "sampling", "greedy", "greedy (temperature 0, no penalty), or default: Parley's default sampling (temperature 0.8, top-k 40, top-p, min-p, repetition penalty 1.1), seeded")
	fs.IntVar(&c.copyPre, "prefix-copy", 0, "instead of the decode rate, measure a new sequence's time to first token when another slot holds this many of its first tokens (copied from it) against evaluating them, -ctx tokens per slot")
	fs.IntVar(&c.huge, "compare-huge-pages", 0, "instead, open the model twice, mapped from the file (-huge-pages off) and on huge pages (auto), and alternate this many rounds of the first -sessions between them")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.cfg.Path == "" {
		return c, errors.New("-model is required")
	}
	if c.sampling != "greedy" && c.sampling != "default" {
		return c, fmt.Errorf("-sampling %q: want greedy or default", c.sampling)
	}
	if c.cfg.Poll == 0 {
		c.cfg.Poll = -1 // the flag's 0 is "no polling"; Config's 0 is the default
	}
	for _, s := range strings.Split(sessions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return c, fmt.Errorf("-sessions: bad number %q", s)
		}
		c.sessions = append(c.sessions, n)
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.quantize != "" {
		if c.out == "" {
			return errors.New("-quantize needs -o")
		}
		return llm.Quantize(c.cfg.Path, c.out, c.quantize, c.cfg.Threads)
	}
	if c.huge > 0 {
		return compareHugePages(ctx, c, stdout)
	}
	maxN := 1
	for _, n := range c.sessions {
		maxN = max(maxN, n)
	}
	llm.SetNativeLog(io.Discard, false)
	c.cfg.Parallel = max(c.cfg.Parallel, maxN)
	c.cfg.Progress = func(float32) {}
	eng, err := llm.Open(c.cfg)
	if err != nil {
		return err
	}
	defer eng.Close()
	fmt.Fprintf(stdout, "model %s, threads %d, poll %d, pool %v, flash-attn %s, engine %s, slots %d, kv-unified %s, huge pages %d MiB, load %s\n",
		eng.Info().Name, c.cfg.Threads, c.cfg.Poll, !c.cfg.NoThreadPool, c.cfg.FlashAttention, eng.EngineName(), c.cfg.Parallel, c.cfg.KVUnified, eng.Info().Device.HugePagesBytes>>20, eng.Info().LoadTime.Round(time.Millisecond))
	if c.profile != "" {
		f, err := os.Create(c.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// One warm-up run: the first decode allocates the compute buffers.
	if _, _, err := measure(ctx, eng, 1, 16, 0, c.sampling); err != nil {
		return err
	}
	if c.copyPre > 0 {
		return measureCopy(ctx, eng, c.copyPre, c.repeats, c.cfg.ContextLength, stdout)
	}
	for _, n := range c.sessions {
		var rates []float64
		var cpus []float64
		for range c.repeats {
			r, cpu, err := measure(ctx, eng, n, c.tokens, c.depth, c.sampling)
			if err != nil {
				return err
			}
			rates, cpus = append(rates, r), append(cpus, cpu)
		}
		sort.Float64s(rates)
		sort.Float64s(cpus)
		// CPU time per token is steadier than the rate on a shared machine
		// (at 1 thread it is the compute; at more it includes the spinning).
		cpuMs := 1000 * cpus[len(cpus)/2]
		fmt.Fprintf(stdout, "sessions %d: %.1f tok/s aggregate (median of %d; best %.1f), %.2f CPU ms per token (median)\n",
			n, rates[len(rates)/2], len(rates), rates[len(rates)-1], cpuMs)
	}
	if c.idle > 0 {
		u0, s0 := cpuTime()
		select {
		case <-time.After(c.idle):
		case <-ctx.Done():
			return ctx.Err()
		}
		u1, s1 := cpuTime()
		fmt.Fprintf(stdout, "idle %s: %.3fs user + %.3fs system CPU (%.2f%% of one core)\n",
			c.idle, u1-u0, s1-s0, 100*(u1-u0+s1-s0)/c.idle.Seconds())
	}
	return nil
}

// measure runs n sequences at once (greedy, or Parley's default sampling), each from its own prompt, for
// tokens tokens, and returns the aggregate rate: all tokens over the wall
// time. With depth > 0 each prompt is depth tokens long and the rate is the
// decode's alone: the tokens after each sequence's first over the time from
// the first token of any to the end. It also returns the process's CPU
// seconds per token over the same span.
func measure(ctx context.Context, eng *llm.Engine, n, tokens, depth int, sampling string) (rate, cpu float64, err error) {
	params := parley.DefaultParams()
	params.MaxTokens, params.Seed = tokens, 1
	if sampling == "greedy" {
		params.Temperature, params.RepeatPenalty = 0, 1
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	total := 0
	var first time.Time
	var cpuFirst float64
	start := time.Now()
	cpuStart := cpuSeconds()
	for i := range n {
		prompt, err := eng.Tokenize(fmt.Sprintf("Once upon a time, child %d went to the park and", i))
		if err != nil {
			return 0, 0, err
		}
		if depth > len(prompt) {
			prompt = deepPrompt(prompt, depth)
		}
		events, err := eng.Generate(ctx, parley.GenerateRequest{Key: fmt.Sprintf("s%d", i), Tokens: prompt, Params: params})
		if err != nil {
			return 0, 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range events {
				if !ev.Done {
					mu.Lock()
					if first.IsZero() {
						first, cpuFirst = time.Now(), cpuSeconds()
					}
					mu.Unlock()
					continue
				}
				mu.Lock()
				total += ev.Usage.CompletionTokens
				if ev.Err != nil && firstErr == nil {
					firstErr = ev.Err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	if depth > 0 && !first.IsZero() {
		return float64(total-n) / time.Since(first).Seconds(), (cpuSeconds() - cpuFirst) / float64(max(1, total-n)), nil
	}
	return float64(total) / time.Since(start).Seconds(), (cpuSeconds() - cpuStart) / float64(max(1, total)), nil
}

// measureCopy prints the median time to first token of three 10-token
// continuations: of a prefix of shared tokens that another slot holds (the
// engine copies that slot's KV cache, Stats.PrefixCopies), of the same
// number of tokens evaluated afresh, and of the 10 tokens alone. The
// difference between the first and the last is what the copy costs; the
// second less the last over shared is what a prompt token costs.
func measureCopy(ctx context.Context, eng *llm.Engine, shared, repeats, perSlot int, stdout io.Writer) error {
	const tail = 10
	params := parley.DefaultParams()
	params.MaxTokens, params.Temperature, params.RepeatPenalty = 1, 0, 1
	vocab := eng.Info().VocabSize
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []int {
		t := make([]int, n)
		for i := range t {
			t[i] = 3 + rng.IntN(vocab-3) // past BOS, EOS and unknown
		}
		return t
	}
	ttft := func(key string, toks []int) (time.Duration, int, error) {
		start := time.Now()
		events, err := eng.Generate(ctx, parley.GenerateRequest{Key: key, Tokens: toks, Params: params})
		if err != nil {
			return 0, 0, err
		}
		var first time.Duration
		cached := 0
		for ev := range events {
			if first == 0 {
				first = time.Since(start)
			}
			if ev.Done {
				if ev.Err != nil {
					return 0, 0, ev.Err
				}
				cached = ev.Usage.CachedPromptTokens
			}
		}
		return first, cached, nil
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var copied, fresh, alone []float64
	for i := range repeats {
		prefix := random(shared)
		key := func(s string) string { return fmt.Sprintf("%s%d", s, i) }
		if _, _, err := ttft(key("holder"), append(slices.Clone(prefix), random(tail)...)); err != nil {
			return err
		}
		before := eng.Stats().PrefixCopies
		tc, cached, err := ttft(key("copy"), append(slices.Clone(prefix), random(tail)...))
		if err != nil {
			return err
		}
		if eng.Stats().PrefixCopies == before || cached < shared {
			return fmt.Errorf("the %d-token prefix was not copied (%d tokens cached): too short for the engine's threshold?", shared, cached)
		}
		tf, _, err := ttft(key("fresh"), random(shared+tail))
		if err != nil {
			return err
		}
		ta, _, err := ttft(key("alone"), random(tail))
		if err != nil {
			return err
		}
		copied, fresh, alone = append(copied, ms(tc)), append(fresh, ms(tf)), append(alone, ms(ta))
	}
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	c, f, a := med(copied), med(fresh), med(alone)
	fmt.Fprintf(stdout, "prefix copy, %d tokens per slot, %d shared + %d new tokens (median of %d): TTFT copied %.1f ms, evaluated %.1f ms, the %d new alone %.1f ms; the copy costs about %.1f ms, a prompt token %.2f ms\n",
		perSlot, shared, tail, repeats, c, f, tail, a, c-a, (f-a)/float64(shared))
	return nil
}

// deepPrompt extends prompt to depth tokens by repeating its tokens after
// the first (BOS stays single).
func deepPrompt(prompt []int, depth int) []int {
	out := slices.Clone(prompt)
	for i := 1; len(out) < depth; i++ {
		out = append(out, prompt[1+(i-1)%(len(prompt)-1)])
	}
	return out
}

// cpuSeconds is the process's user + system CPU seconds so far.
func cpuSeconds() float64 {
	u, s := cpuTime()
	return u + s
}

// cpuTime is the process's user and system CPU seconds so far.
func cpuTime() (user, sys float64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime), tv(ru.Stime)
}

// compareHugePages opens the model twice in this process, its weights
// mapped from the file and on huge pages, and alternates c.huge rounds of
// the first -sessions between them (the order swapping every round), so a
// slow minute on this machine falls on both. It prints every round, the
// mean rates and the median ratio.
func compareHugePages(ctx context.Context, c config, stdout io.Writer) error {
	llm.SetNativeLog(io.Discard, false)
	n := c.sessions[0]
	c.cfg.Parallel = max(c.cfg.Parallel, n)
	c.cfg.Progress = func(float32) {}
	var engs [2]*llm.Engine
	for i, mode := range []string{llm.HugePagesOff, llm.HugePagesAuto} {
		cfg := c.cfg
		cfg.HugePages = mode
		eng, err := llm.Open(cfg)
		if err != nil {
			return err
		}
		defer eng.Close()
		engs[i] = eng
		fmt.Fprintf(stdout, "%s: engine %s, huge pages %d MiB, load %s\n", mode, eng.EngineName(),
			eng.Info().Device.HugePagesBytes>>20, eng.Info().LoadTime.Round(time.Millisecond))
		if _, _, err := measure(ctx, eng, 1, 16, 0, c.sampling); err != nil {
			return err
		}
	}
	if engs[1].Info().Device.HugePagesBytes == 0 {
		return errors.New("the weights are not on huge pages here (see the log): nothing to compare")
	}
	// The background move onto huge pages takes a second or so.
	time.Sleep(2 * time.Second)
	var sum [2]float64
	var ratios []float64
	for r := range c.huge {
		var rate [2]float64
		for j := range 2 {
			k := (r + j) % 2
			x, _, err := measure(ctx, engs[k], n, c.tokens, c.depth, c.sampling)
			if err != nil {
				return err
			}
			rate[k] = x
			sum[k] += x
		}
		ratios = append(ratios, rate[1]/rate[0])
		fmt.Fprintf(stdout, "round %d: mapped %.1f tok/s, huge pages %.1f (%.3f)\n", r+1, rate[0], rate[1], rate[1]/rate[0])
	}
	ahead := 0
	for _, x := range ratios {
		if x > 1 {
			ahead++
		}
	}
	sort.Float64s(ratios)
	fmt.Fprintf(stdout, "sessions %d, %d rounds: mapped %.1f tok/s, huge pages %.1f (means); huge pages / mapped: median %.3f, ahead in %d of %d\n",
		n, c.huge, sum[0]/float64(c.huge), sum[1]/float64(c.huge), ratios[len(ratios)/2], ahead, c.huge)
	return nil
}
