// Command fairbench measures how fairly bin/parley shares its slots between
// users: one heavy user keeps -heavy streams going while -light users each
// send one short request at a time. It starts the server on a free loopback
// port with a key per user, and runs three bounded phases:
//
//  1. solo: the light users alone, one request at a time: their TTFT;
//  2. heavy: the heavy user alone: the aggregate tokens per second;
//  3. mixed: both at once: the light users' TTFT and the aggregate.
//
// It prints the light users' median and 95th percentile TTFT in each phase
// and the aggregate throughput, so a build can be compared with another
// (-bin) on the same machine, and under each phase what the engine did, by
// its own counters (decode steps, tokens generated a step, tokens decoded a
// token generated, preemptions, CPU seconds): figures that hold whatever the
// machine's speed. -repeat alternates the heavy and mixed phases, and
// -light-every offers the light users' requests at a fixed rate, so two
// builds get the same light load however fast they serve it:
//
//	go run ./tools/fairbench -bin bin/parley -duration 20s
//	go run ./tools/fairbench -repeat 6 -duration 5s -light-every 150ms
//
// Only loopback; every phase ends after -duration, the whole run after
// -timeout.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/tools/internal/harness"
)

type config struct {
	bin, model      string
	heavy, light    int
	parallel        int
	threads         int
	heavyTokens     int
	lightTokens     int
	duration        time.Duration
	timeout         time.Duration
	extra           string // more server flags, space-separated
	prompt          string
	lightPause      time.Duration
	lightEvery      time.Duration
	repeat          int
	heavyRetryPause time.Duration
}

func main() { harness.Main("fairbench", run) }

func run(ctx context.Context, args []string, out io.Writer) error {
	root := repo.WorkingRoot()
	var c config
	fs := flag.NewFlagSet("fairbench", flag.ContinueOnError)
	fs.StringVar(&c.bin, "bin", filepath.Join(root, "bin", "parley"), "parley binary")
	fs.StringVar(&c.model, "model", repo.TestModel(root), "GGUF model")
	fs.IntVar(&c.heavy, "heavy", 64, "the heavy user's streams")
	fs.IntVar(&c.light, "light", 8, "light users, one request at a time each")
	fs.IntVar(&c.parallel, "parallel", 4, "parley --parallel")
	fs.IntVar(&c.threads, "threads", 2, "parley --threads")
	fs.IntVar(&c.heavyTokens, "heavy-tokens", 128, "tokens per heavy reply")
	fs.IntVar(&c.lightTokens, "light-tokens", 16, "tokens per light reply")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "length of each phase")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "deadline of the whole run")
	fs.DurationVar(&c.lightPause, "light-pause", 100*time.Millisecond, "a light user's pause between its requests")
	fs.DurationVar(&c.lightEvery, "light-every", 0, "a light user starts a request at this interval (or at once when its last one ends later), whatever the server's speed, so that two builds are offered the same light load (0: -light-pause after each reply)")
	fs.IntVar(&c.repeat, "repeat", 1, "alternate the heavy-alone and mixed phases this many times, summing each")
	fs.StringVar(&c.extra, "args", "", "more parley flags, space-separated")
	fs.StringVar(&c.prompt, "prompt", "Once upon a time", "every request's prompt")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.repeat = max(c.repeat, 1)
	c.heavyRetryPause = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	dir, err := os.MkdirTemp("", "parley-fairbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sargs := []string{"--model", c.model, "--store", "memory", "--data-dir", dir,
		"--parallel", strconv.Itoa(c.parallel), "--threads", strconv.Itoa(c.threads), "--ctx", "512",
		"--max-tokens", strconv.Itoa(max(c.heavyTokens, c.lightTokens)), "--log-level", "warn",
		"--user", "heavy:heavy-key", "--max-http-conns-per-ip", "4096", "--max-conns-per-ip", "4096"}
	for i := range c.light {
		sargs = append(sargs, "--user", fmt.Sprintf("light%d:light-key-%d", i, i))
	}
	sargs = append(sargs, strings.Fields(c.extra)...)
	srv, err := harness.Start(ctx, c.bin, sargs, nil, nil)
	if err != nil {
		return err
	}
	defer srv.Kill()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	b := &bench{c: c, base: srv.URL(), client: client, pid: srv.Cmd.Process.Pid}

	fmt.Fprintf(out, "fairbench: %s, --parallel %d --threads %d, %d heavy streams of %d tokens, %d light users of %d tokens, %s a phase\n",
		c.bin, c.parallel, c.threads, c.heavy, c.heavyTokens, c.light, c.lightTokens, c.duration)
	solo := b.phase(ctx, 0, c.light)
	fmt.Fprintf(out, "solo:  light TTFT p50 %s p95 %s, slot wait p95 %s (%d requests)\n",
		pct(solo.ttft, 50), pct(solo.ttft, 95), pct(solo.queued, 95), len(solo.ttft))
	fmt.Fprintf(out, "       engine: %s\n", solo.engine)
	// The heavy user alone and beside the light users, alternated -repeat
	// times: the machine's speed drifts between runs and within one, and
	// alternating phases gives both the same drift.
	heavy, mixed := &phaseResult{}, &phaseResult{}
	var ratios []string
	for range c.repeat {
		b.settle(ctx)
		h := b.phase(ctx, c.heavy, 0)
		b.settle(ctx)
		m := b.phase(ctx, c.heavy, c.light)
		ratios = append(ratios, fmt.Sprintf("%.2f", m.rate(c.duration)/max(h.rate(c.duration), 1e-9)))
		heavy.add(h)
		mixed.add(m)
	}
	span := c.duration * time.Duration(c.repeat)
	fmt.Fprintf(out, "heavy: %.1f tokens/s aggregate, %d busy refusals\n", heavy.rate(span), heavy.busy)
	fmt.Fprintf(out, "       engine: %s\n", heavy.engine)
	fmt.Fprintf(out, "mixed: light TTFT p50 %s p95 %s, slot wait p50 %s p95 %s (%d requests, %d refused), %.1f tokens/s aggregate, heavy refused %d\n",
		pct(mixed.ttft, 50), pct(mixed.ttft, 95), pct(mixed.queued, 50), pct(mixed.queued, 95), len(mixed.ttft), mixed.lightBusy,
		mixed.rate(span), mixed.busy)
	fmt.Fprintf(out, "       engine: %s\n", mixed.engine)
	if p95 := pct(solo.ttft, 95); p95 > 0 {
		fmt.Fprintf(out, "light p95 TTFT mixed/solo: %.2f; aggregate mixed/heavy alone: %.2f\n",
			float64(pct(mixed.ttft, 95))/float64(p95), mixed.rate(span)/heavy.rate(span))
		if c.repeat > 1 {
			fmt.Fprintf(out, "aggregate mixed/heavy alone by repeat: %s\n", strings.Join(ratios, " "))
		}
	}
	return ctx.Err()
}

type bench struct {
	pid    int // the server's, for its CPU time
	c      config
	base   string
	client *http.Client
}

type phaseResult struct {
	mu        sync.Mutex
	ttft      []time.Duration // light users'
	queued    []time.Duration // light users' wait for a slot (the reply's timings.queued_ms)
	tokens    int             // every user's
	busy      int             // heavy's refusals
	lightBusy int
	engine    engineWork // what the engine did in the phase, from /metrics
}

// add sums o into r (one phase's repeats).
func (r *phaseResult) add(o *phaseResult) {
	r.ttft = append(r.ttft, o.ttft...)
	r.queued = append(r.queued, o.queued...)
	r.tokens += o.tokens
	r.busy += o.busy
	r.lightBusy += o.lightBusy
	w, v := &r.engine, o.engine
	w.steps += v.steps
	w.generated += v.generated
	w.evaluated += v.evaluated
	w.preemptions += v.preemptions
	w.swaps += v.swaps
	w.decodeSeconds += v.decodeSeconds
	w.decoded += v.decoded
	w.cpuSeconds += v.cpuSeconds
	w.drafted += v.drafted
	w.accepted += v.accepted
}

func (r *phaseResult) rate(d time.Duration) float64 { return float64(r.tokens) / d.Seconds() }

// phase runs heavy streams and light users for the configured duration.
func (b *bench) phase(ctx context.Context, heavy, light int) *phaseResult {
	ctx, cancel := context.WithTimeout(ctx, b.c.duration)
	defer cancel()
	r := &phaseResult{}
	before, _ := b.counters()
	cpu0 := cpuSeconds(b.pid)
	var wg sync.WaitGroup
	for range heavy {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, n, status, _ := b.stream(ctx, "heavy-key", b.c.heavyTokens)
				r.mu.Lock()
				r.tokens += n
				if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
					r.busy++
				}
				r.mu.Unlock()
				if status != http.StatusOK {
					sleep(ctx, b.c.heavyRetryPause)
				}
			}
		}()
	}
	for i := range light {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("light-key-%d", i)
			next := time.Now()
			for ctx.Err() == nil {
				next = next.Add(b.c.lightEvery)
				ttft, n, status, queued := b.stream(ctx, key, b.c.lightTokens)
				r.mu.Lock()
				r.tokens += n
				if status == http.StatusOK && ttft > 0 && ctx.Err() == nil {
					r.ttft = append(r.ttft, ttft)
					r.queued = append(r.queued, queued)
				} else if status != http.StatusOK && status != 0 {
					r.lightBusy++
				}
				r.mu.Unlock()
				if b.c.lightEvery > 0 {
					if time.Until(next) < 0 {
						next = time.Now() // late: the next at once, the cadence from there
					}
					sleep(ctx, time.Until(next))
				} else {
					sleep(ctx, b.c.lightPause)
				}
			}
		}()
	}
	wg.Wait()
	after, err := b.counters()
	if err == nil && before != nil {
		r.engine = work(before, after)
		r.engine.cpuSeconds = cpuSeconds(b.pid) - cpu0
	}
	return r
}

// stream sends one streamed completion and returns its time to the first
// token, the tokens it got, the HTTP status (0 when the request did not
// complete), and how long the reply waited for a slot (the server's
// timings.queued_ms in the final chunk: the part of the time to the first
// token that the sharing of slots decides).
func (b *bench) stream(ctx context.Context, key string, n int) (time.Duration, int, int, time.Duration) {
	body, _ := json.Marshal(map[string]any{"prompt": b.c.prompt, "max_tokens": n, "stream": true, "temperature": 0.8})
	req, err := http.NewRequestWithContext(ctx, "POST", b.base+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		return 0, 0, 0, 0
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	res, err := b.client.Do(req)
	if err != nil {
		return 0, 0, 0, 0
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, res.Body)
		return 0, 0, res.StatusCode, 0
	}
	var ttft, queued time.Duration
	tokens := 0
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: {") {
			continue
		}
		var ev struct {
			Choices []struct{ Text string }
			Timings *struct {
				QueuedMS float64 `json:"queued_ms"`
			}
		}
		if json.Unmarshal([]byte(line[len("data: "):]), &ev) != nil {
			continue
		}
		if ev.Timings != nil {
			queued = time.Duration(ev.Timings.QueuedMS * float64(time.Millisecond))
		}
		if len(ev.Choices) == 0 || ev.Choices[0].Text == "" {
			continue
		}
		if tokens == 0 {
			ttft = time.Since(start)
		}
		tokens++
	}
	if sc.Err() != nil {
		return 0, tokens, 0, 0
	}
	return ttft, tokens, res.StatusCode, queued
}

// settle waits until the server counts none of the last phase's clients as
// present (a client counts for 2 s after its last reply, for the cap on one
// client's slots), so that each phase starts with only its own clients.
func (b *bench) settle(ctx context.Context) {
	sleep(ctx, 3*time.Second)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pct is the p-th percentile of ds (0 when empty), to the millisecond.
func pct(ds []time.Duration, p float64) time.Duration {
	return harness.Percentile(ds, p).Round(time.Millisecond)
}

// engineWork is what the engine did in a phase, by the server's own
// counters: the figures that say where an aggregate's tokens per second
// went whatever the machine's speed (how full each decode step was, how many
// prompt tokens were evaluated, again after a preemption too, and how much of
// the phase the engine spent decoding).
type engineWork struct {
	steps, generated, evaluated, preemptions float64
	swaps, decodeSeconds, decoded            float64
	drafted, accepted                        float64 // draft tokens decoded, and those that held
	cpuSeconds                               float64 // the server process's, user and system
}

func (w engineWork) String() string {
	if w.steps == 0 {
		return "no decode steps"
	}
	return fmt.Sprintf("%.0f decode steps, %.2f generated tokens a step (%.2f tokens decoded a generated token), %.0f prompt tokens evaluated (%.2f per generated token), %d preemptions (%d states copied out), %.1f s decoding (%.0f generated tokens per decoding second)",
		w.steps, w.generated/w.steps, w.decoded/max(w.generated, 1), w.evaluated, w.evaluated/max(w.generated, 1), int(w.preemptions), int(w.swaps), w.decodeSeconds,
		w.generated/max(w.decodeSeconds, 1e-9)) +
		fmt.Sprintf(", %.1f CPU seconds (%.0f generated tokens per CPU second), %.0f draft tokens (%.0f held)",
			w.cpuSeconds, w.generated/max(w.cpuSeconds, 1e-9), w.drafted, w.accepted)
}

// cpuSeconds is process pid's user and system CPU time so far (0 when
// unknown), from /proc/PID/stat at the usual 100 ticks a second.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: state is the
	// first (field 3), utime and stime fields 14 and 15.
	i := strings.LastIndex(string(b), ") ")
	f := strings.Fields(string(b[i+2:]))
	if i < 0 || len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

// engineCounters are the /metrics series engineWork is made of.
var engineCounters = []string{"parley_decode_steps_total", "parley_generated_tokens_total",
	"parley_prompt_tokens_evaluated_total", "parley_preemptions_total", "parley_decode_seconds_total", "parley_preemption_swaps_total", "parley_decoded_tokens_total",
	"parley_draft_tokens_total", "parley_draft_tokens_accepted_total"}

func work(before, after map[string]float64) engineWork {
	d := func(name string) float64 { return after[name] - before[name] }
	return engineWork{steps: d(engineCounters[0]), generated: d(engineCounters[1]), evaluated: d(engineCounters[2]),
		preemptions: d(engineCounters[3]), decodeSeconds: d(engineCounters[4]), swaps: d(engineCounters[5]), decoded: d(engineCounters[6]),
		drafted: d(engineCounters[7]), accepted: d(engineCounters[8])}
}

// counters reads engineCounters from the server's /metrics (a user's key
// reads them).
func (b *bench) counters() (map[string]float64, error) {
	req, err := http.NewRequest("GET", b.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer heavy-key")
	res, err := b.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", res.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// name{labels} value: a series with labels adds to its name's sum.
		line := sc.Text()
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		name, _, _ := strings.Cut(line[:sp], "{")
		if !slices.Contains(engineCounters, name) {
			continue
		}
		if v, err := strconv.ParseFloat(line[sp+1:], 64); err == nil {
			m[name] += v
		}
	}
	return m, sc.Err()
}
