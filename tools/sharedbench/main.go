// Command sharedbench measures the shared KV tier (--kv-cache-shared) with
// several replicas behind nginx and one Redis on this machine: stateless
// conversations (the OpenAI API, resent whole each turn) run turn by turn
// through nginx, and each turn records the replica that served it, its
// time to the first token and how many prompt tokens it evaluated beyond
// its new ones. It runs, each on fresh replicas:
//
//   - keys: every conversation sends its X-Parley-Session key; nginx hashes on it.
//   - keys-nowait: keys, with --kv-cache-shared-wait=false (a reply ends
//     before its state is in the tier): what the wait adds to a reply's end.
//   - kill: keys, and one replica is killed (-9) once half the turns are done.
//   - rr: no key, nginx round-robin, the shared tier on.
//   - rr-local: no key, round-robin, no shared tier (each replica its own RAM).
//
// then one long conversation's next turn on its own replica (warm), on
// another replica (restored from the tier) and on a replica without the
// tier (cold). It prints hit rates (turns 2+ that evaluated at most their
// new tokens + 16), TTFT p50/p95, the replicas' restore times and how long
// replies' ends waited for their states to reach the tier.
//
//	go build -o bin/parley ./cmd/parley && go run ./tools/sharedbench -model models/stories260K.gguf
//
// Bounded for a small machine: each replica decodes on one thread.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() { harness.Main("sharedbench", run) }

type options struct {
	bin, model, redisBin, nginxBin string
	replicas, convs, turns, maxTok int
	workers, longTokens, slack     int
	longSamples                    int
	modes                          []string
	verbose, killSettled           bool
	out                            io.Writer // where the figures are printed
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o := options{out: stdout}
	var modes string
	fs := flag.NewFlagSet("sharedbench", flag.ContinueOnError)
	fs.StringVar(&o.bin, "bin", "bin/parley", "the parley binary")
	fs.StringVar(&o.model, "model", "", "the model file (required)")
	fs.IntVar(&o.replicas, "replicas", 3, "replicas behind nginx")
	fs.IntVar(&o.convs, "convs", 32, "conversations")
	fs.IntVar(&o.turns, "turns", 8, "turns per conversation")
	fs.IntVar(&o.maxTok, "max-tokens", 24, "tokens per reply")
	fs.IntVar(&o.workers, "workers", 4, "conversations in flight at once")
	fs.IntVar(&o.longTokens, "long", 1500, "about how many tokens the long conversation holds (within the model's context)")
	fs.IntVar(&o.longSamples, "long-samples", 5, "next turns of the long conversation measured on each replica (the median is reported)")
	fs.IntVar(&o.slack, "slack", 16, "tokens a warm turn may evaluate beyond its new ones")
	fs.BoolVar(&o.killSettled, "kill-settled", false, "kill once the replicas have written the last round's states (false: at once after the round's last reply; with --kv-cache-shared-wait, on by default, its state is in the tier by then)")
	fs.BoolVar(&o.verbose, "v", false, "print every turn that evaluated more than its new tokens + slack")
	fs.StringVar(&modes, "modes", "keys,keys-nowait,kill,rr,rr-local", "which runs, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.model == "" {
		return errors.New("-model is required")
	}
	o.modes = strings.Split(modes, ",")
	var err error
	if o.redisBin, err = exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	if o.nginxBin, err = exec.LookPath("nginx"); err != nil {
		if o.nginxBin, err = exec.LookPath("/usr/sbin/nginx"); err != nil {
			return fmt.Errorf("nginx: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "sharedbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rdsAddr, err := proc.FreeAddr()
	if err != nil {
		return err
	}
	rds, err := redistest.Launch(o.redisBin, rdsAddr, dir, nil)
	if err != nil {
		return err
	}
	defer rds.Kill()

	fmt.Fprintf(o.out, "sharedbench: %d replicas, %d conversations x %d turns, %d tokens a reply, %d in flight\n",
		o.replicas, o.convs, o.turns, o.maxTok, o.workers)
	for i, mode := range o.modes {
		if mode == "" {
			continue // -modes "": the long conversation alone
		}
		if err := runMode(ctx, o, dir, rdsAddr, mode, 2*i); err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
	}
	return longTurn(ctx, o, dir, rdsAddr)
}

// replica is one parley process.
type replica struct {
	*harness.Server
	out proc.Buffer // its log, for the error when it does not start
}

func startReplica(ctx context.Context, o options, args ...string) (*replica, error) {
	r := &replica{}
	args = append([]string{"--model", o.model, "--log-format", "json", "--log-level", "warn",
		"--threads", "1", "--parallel", "2", "--temperature", "0", "--max-tokens", strconv.Itoa(o.maxTok),
		"--session-creates-per-minute", "0"}, args...)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := harness.Start(ctx, o.bin, args, nil, &r.out)
	if err != nil {
		return nil, fmt.Errorf("replica: %w\n%s", err, r.out.String())
	}
	r.Server = srv
	return r, nil
}

// nginxConf is deploy/nginx.conf's routing (hash: true) or round-robin,
// with the serving replica in a response header.
const nginxConf = `worker_processes 1;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log crit;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/body; proxy_temp_path %[1]s/proxy; fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi; scgi_temp_path %[1]s/scgi;
  map $http_x_parley_session $parley_key_1 { default $http_x_parley_session; '' $arg_session; }
  map $parley_key_1 $parley_key_2 { default $parley_key_1; '' $http_authorization; }
  map $parley_key_2 $parley_affinity { default $parley_key_2; '' $remote_addr; }
  upstream parley {
%[2]s%[3]s  }
  server {
    listen %[4]s;
    location / {
      proxy_pass http://parley;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_buffering off;
      proxy_connect_timeout 1s;
      proxy_read_timeout 10m;
      proxy_next_upstream error timeout;
      add_header X-Upstream $upstream_addr always;
    }
  }
}
`

func startNginx(o options, dir string, hash bool, reps []*replica) (*proc.Proc, string, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	ndir, err := os.MkdirTemp(dir, "nginx")
	if err != nil {
		return nil, "", err
	}
	h := ""
	if hash {
		h = "    hash $parley_affinity consistent;\n"
	}
	var ups strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&ups, "    server %s max_fails=1 fail_timeout=60s;\n", r.Addr)
	}
	conf := filepath.Join(ndir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, ndir, h, ups.String(), addr)), 0o600); err != nil {
		return nil, "", err
	}
	cmd := exec.Command(o.nginxBin, "-p", ndir, "-c", conf, "-e", filepath.Join(ndir, "error.log"))
	cmd.WaitDelay = time.Second
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitHTTP(ctx, "http://"+addr+"/health"); err != nil {
		p.Kill()
		return nil, "", err
	}
	return p, addr, nil
}

func stopNginx(p *proc.Proc) {
	p.Cmd.Process.Signal(syscall.SIGTERM)
	if exited, _ := p.WaitFor(5 * time.Second); !exited {
		p.Kill()
	}
}

// turnResult is one turn's record.
type turnResult struct {
	conv, turn        int
	replica           string
	prompt, cached    int
	newTokens         int
	ttft              time.Duration
	moved, err        bool
	afterKill, killed bool
	retried           int // tries again after an error (a reply cut by the kill)
}

// reply is one streamed chat completion's record.
type reply struct {
	text                       string
	prompt, cached, completion int
	ttft                       time.Duration
	upstream                   string // the replica nginx chose
}

// chat posts one streamed chat completion and returns its record.
func chat(addr, key string, msgs []map[string]string, maxTok int) (out reply, err error) {
	body, _ := json.Marshal(map[string]any{"messages": msgs, "max_tokens": maxTok, "temperature": 0, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-Parley-Session", key)
	}
	t0 := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, err
	}
	defer res.Body.Close()
	out.upstream = res.Header.Get("X-Upstream")
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		return out, fmt.Errorf("%d %s", res.StatusCode, b)
	}
	var sb strings.Builder
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &ch) != nil {
			continue
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" && out.ttft == 0 {
				out.ttft = time.Since(t0)
			}
			sb.WriteString(c.Delta.Content)
		}
		if ch.Usage != nil {
			out.prompt, out.completion, out.cached = ch.Usage.PromptTokens, ch.Usage.CompletionTokens, ch.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if out.ttft == 0 {
		out.ttft = time.Since(t0)
	}
	out.text = sb.String()
	return out, sc.Err()
}

var openings = []string{"Lily found a red ball.", "Tom had a big dog.", "The sun was hot.", "Sam saw a little bird.",
	"Mia went to the park.", "Ben made a cake.", "The cat was sad.", "Anna had a blue hat.", "A boy lost his toy.", "The fish swam fast."}
var follows = []string{"What did they do next?", "Who else came?", "Where did they go?", "What happened at the end?", "Why was that?", "And then?"}

// runMode runs the conversations on fresh replicas (Redis databases db and
// db+1 for the sessions and the KV states) and prints its figures.
func runMode(ctx context.Context, o options, dir, rdsAddr, mode string, db int) error {
	shared := mode != "rr-local"
	hash := mode == "keys" || mode == "keys-nowait" || mode == "kill"
	args := []string{"--store", fmt.Sprintf("redis://%s/%d", rdsAddr, db)}
	if shared {
		args = append(args, "--kv-cache-shared", fmt.Sprintf("redis://%s/%d", rdsAddr, db+1))
	}
	if mode == "keys-nowait" {
		args = append(args, "--kv-cache-shared-wait=false")
	}
	reps := make([]*replica, o.replicas)
	for i := range reps {
		r, err := startReplica(ctx, o, args...)
		if err != nil {
			return err
		}
		reps[i] = r
		defer r.Kill()
	}
	ng, lb, err := startNginx(o, dir, hash, reps)
	if err != nil {
		return err
	}
	defer stopNginx(ng)

	// The conversations advance in rounds, one turn each per round (a
	// user reads a reply before the next prompt): the kill comes between
	// two rounds, half way, with every conversation mid-run.
	type conv struct {
		key     string
		msgs    []map[string]string
		carried int
		last    string
		failed  bool
	}
	convs := make([]*conv, o.convs)
	for c := range convs {
		convs[c] = &conv{msgs: []map[string]string{{"role": "user", "content": fmt.Sprintf("%s Story %d.", openings[c%len(openings)], c)}}}
		if hash {
			convs[c].key = fmt.Sprintf("bench-conv-%d", c)
		}
	}
	var mu sync.Mutex
	var results []turnResult
	var killedAddr string
	for j := range o.turns {
		if mode == "kill" && j == o.turns/2 {
			if o.killSettled {
				// A turn's state reaches the tier a few milliseconds after
				// its reply: wait for it, as a user reading the reply would.
				for _, rp := range reps {
					waitSettled(rp.Addr)
				}
			}
			// The replica that served conversation 0 last goes.
			for _, rp := range reps {
				if rp.Addr == convs[0].last {
					rp.Cmd.Process.Signal(syscall.SIGKILL)
					rp.WaitFor(time.Minute)
					killedAddr = rp.Addr
					fmt.Fprintf(o.out, "  kill -9 %s after %d of %d rounds\n", rp.Addr, j, o.turns)
				}
			}
		}
		jobs := make(chan *conv)
		var wg sync.WaitGroup
		for range o.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for cv := range jobs {
					if j > 0 {
						cv.msgs = append(cv.msgs, map[string]string{"role": "user", "content": follows[(len(cv.msgs)/2+j)%len(follows)]})
					}
					// A reply cut by the kill is retried, as the OpenAI SDKs do (twice).
					rp, err := chat(lb, cv.key, cv.msgs, o.maxTok)
					retried := 0
					for ; err != nil && retried < 2; retried++ {
						rp, err = chat(lb, cv.key, cv.msgs, o.maxTok)
					}
					up := rp.upstream
					r := turnResult{turn: j + 1, replica: up, prompt: rp.prompt, cached: rp.cached, newTokens: rp.prompt - cv.carried,
						ttft: rp.ttft, moved: j > 0 && up != cv.last, err: err != nil, retried: retried,
						afterKill: killedAddr != "", killed: killedAddr != "" && cv.last == killedAddr}
					for c := range convs {
						if convs[c] == cv {
							r.conv = c
						}
					}
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
					if err != nil {
						fmt.Fprintf(o.out, "  conv %d turn %d: %v\n", r.conv, j+1, err)
						cv.failed = true
						continue
					}
					cv.msgs = append(cv.msgs, map[string]string{"role": "assistant", "content": rp.text})
					cv.carried, cv.last = rp.prompt+rp.completion, up
				}
			}()
		}
		for _, cv := range convs {
			if !cv.failed {
				jobs <- cv
			}
		}
		close(jobs)
		wg.Wait()
	}
	report(o, mode, results, reps, killedAddr)
	return nil
}

func report(o options, mode string, rs []turnResult, reps []*replica, killed string) {
	var ttfts, moveTTFT []time.Duration
	warm, later, errs, moved, movedWarm, retries := 0, 0, 0, 0, 0, 0
	for _, r := range rs {
		retries += r.retried
		if r.err {
			errs++
			continue
		}
		ttfts = append(ttfts, r.ttft)
		if r.turn == 1 {
			continue
		}
		later++
		hit := r.prompt-r.cached <= r.newTokens+o.slack
		if hit {
			warm++
		} else if o.verbose {
			fmt.Fprintf(o.out, "  cold: conv %d turn %d on %s (moved %t): %d prompt tokens, %d cached, %d new\n",
				r.conv, r.turn, r.replica, r.moved, r.prompt, r.cached, r.newTokens)
		}
		if r.moved {
			moved++
			moveTTFT = append(moveTTFT, r.ttft)
			if hit {
				movedWarm++
			}
		}
	}
	var restores, restoreSec, waits, waitSec float64
	for _, rp := range reps {
		if rp.Addr == killed {
			continue
		}
		restores += scrape(rp.Addr, "parley_kv_restores_total")
		restoreSec += scrape(rp.Addr, "parley_kv_restore_seconds_total")
		waits += scrape(rp.Addr, "parley_kv_shared_waits_total")
		waitSec += scrape(rp.Addr, "parley_kv_shared_wait_seconds_total")
	}
	fmt.Fprintf(o.out, "%-9s turns %d (lost %d, retried %d); turns 2+ within new+%d: %d/%d (%.1f%%); moved %d, of them warm %d; TTFT p50 %v p95 %v",
		mode, len(rs), errs, retries, o.slack, warm, later, pct(warm, later), moved, movedWarm, pctl(ttfts, 50), pctl(ttfts, 95))
	if len(moveTTFT) > 0 {
		fmt.Fprintf(o.out, "; moved TTFT p50 %v p95 %v", pctl(moveTTFT, 50), pctl(moveTTFT, 95))
	}
	if restores > 0 {
		fmt.Fprintf(o.out, "; restores %.0f, mean %.2f ms", restores, 1000*restoreSec/restores)
	}
	if waits > 0 {
		fmt.Fprintf(o.out, "; ends held for the tier %.0f, mean %.2f ms", waits, 1000*waitSec/waits)
	}
	fmt.Fprintln(o.out)
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// pctl is the p-th percentile of ds (0 when empty), to 0.1 ms.
func pctl(ds []time.Duration, p float64) time.Duration {
	return harness.Percentile(ds, p).Round(100 * time.Microsecond)
}

// scrape returns one sample of a replica's /metrics (0 when absent).
func scrape(addr, sample string) float64 {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// waitSettled waits until a replica has saved its states to the tier.
func waitSettled(addr string) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && (scrape(addr, "parley_kv_unsaved_slots") != 0 || scrape(addr, "parley_kv_disk_pending") != 0) {
		time.Sleep(20 * time.Millisecond)
	}
}

// longTurn measures one long conversation's next turn: warm on its own
// replica, restored on another, and cold on a replica without the tier.
func longTurn(ctx context.Context, o options, dir, rdsAddr string) error {
	args := []string{"--store", fmt.Sprintf("redis://%s/10", rdsAddr), "--kv-cache-shared", fmt.Sprintf("redis://%s/11", rdsAddr), "--ctx", "2048"}
	a, err := startReplica(ctx, o, args...)
	if err != nil {
		return err
	}
	defer a.Kill()
	b, err := startReplica(ctx, o, args...)
	if err != nil {
		return err
	}
	defer b.Kill()
	c, err := startReplica(ctx, o, "--store", "memory", "--ctx", "2048")
	if err != nil {
		return err
	}
	defer c.Kill()
	var sb strings.Builder
	for i := 0; sb.Len()/2 < o.longTokens; i++ { // about 2 bytes a token
		fmt.Fprintf(&sb, "%s ", openings[i%len(openings)])
	}
	base := []map[string]string{{"role": "user", "content": sb.String()}}
	first, err := chat(a.Addr, "", base, 8)
	if err != nil {
		return err
	}
	reply, prompt := first.text, first.prompt
	waitSettled(a.Addr)
	var warm, moved, cold, restore []time.Duration
	for i := range o.longSamples {
		msgs := append(slices.Clone(base), map[string]string{"role": "assistant", "content": reply},
			map[string]string{"role": "user", "content": follows[i%len(follows)]})
		for _, m := range []struct {
			addr string
			into *[]time.Duration
		}{{a.Addr, &warm}, {b.Addr, &moved}, {c.Addr, &cold}} {
			rp, err := chat(m.addr, "", msgs, 2) // 2: an API sends a reply's last token with its end, which may wait for the tier
			if err != nil {
				return err
			}
			*m.into = append(*m.into, rp.ttft)
		}
		// b restored it once since it started: the fetch from the tier,
		// its checks and llama.cpp's load.
		if n := scrape(b.Addr, "parley_kv_restores_total"); n > 0 {
			restore = append(restore, time.Duration(float64(time.Second)*scrape(b.Addr, "parley_kv_restore_seconds_total")/n))
		}
		// b's RAM and slot now hold it: next time it must come from the tier
		// again, so b restarts (its RAM gone).
		b.Kill()
		if b, err = startReplica(ctx, o, args...); err != nil {
			return err
		}
		defer b.Kill()
		// c's slot holds it: a fresh c is cold again.
		c.Kill()
		if c, err = startReplica(ctx, o, "--store", "memory", "--ctx", "2048"); err != nil {
			return err
		}
		defer c.Kill()
	}
	med := func(d []time.Duration) time.Duration { return pctl(d, 50) }
	fmt.Fprintf(o.out, "long conversation (%d prompt tokens): next-turn TTFT warm %v, moved (restored from the tier) %v, cold %v: moved/warm %.2fx, moved/cold %.0f%%; the restore %v\n",
		prompt, med(warm), med(moved), med(cold), float64(med(moved))/float64(med(warm)), 100*float64(med(moved))/float64(med(cold)), med(restore))
	return nil
}
