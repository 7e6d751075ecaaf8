// Command modelbench measures several models in one server on
// bin/parley, and writes a "## Several models" section into BENCHMARKS.md
// between its own markers:
//
//   - cold: time to first token of a model that is not loaded (its load
//     included), over -runs requests, the model unloaded before each;
//
//   - warm: the same request to the model once loaded;
//
//   - switch: requests that alternate between two models with
//     --max-loaded-models 1 (each one unloads the other and loads its own),
//     against the same alternation with both kept loaded.
//
//     go run ./tools/modelbench -parley bin/parley     # the synthetic 135M models (go run ./tools/mkgguf)
//
// The server runs on loopback with its own folder of models (links to the
// given files) and is stopped whatever happens.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/tools/internal/benchmd"
	"github.com/parley-chat/parley/tools/internal/harness"
)

const (
	beginMarker = "<!-- tools/modelbench: generated section, rewritten by `go run ./tools/modelbench` -->"
	endMarker   = "<!-- /tools/modelbench -->"
	apiKey      = "modelbench"
)

func main() { harness.Main("modelbench", run) }

type config struct {
	bin, a, b, out string
	runs, threads  int
	ctx, parallel  int
	timeout        time.Duration
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	home, _ := os.UserHomeDir()
	cache := filepath.Join(home, ".cache", "parley", "models")
	var c config
	fs := flag.NewFlagSet("modelbench", flag.ContinueOnError)
	fs.StringVar(&c.bin, "parley", "bin/parley", "the server binary")
	fs.StringVar(&c.a, "a", filepath.Join(cache, "synthetic-smollm2-135m-q8_0.gguf"), "the first model")
	fs.StringVar(&c.b, "b", filepath.Join(cache, "synthetic-smollm2-135m-q4_0.gguf"), "the second model")
	fs.StringVar(&c.out, "out", "BENCHMARKS.md", "the file whose section is rewritten (\"\": print only)")
	fs.IntVar(&c.runs, "runs", 5, "requests per figure")
	fs.IntVar(&c.threads, "threads", 1, "--threads (1: on a machine shared with other jobs, more threads stall each other)")
	fs.IntVar(&c.ctx, "ctx", 2048, "--ctx")
	fs.IntVar(&c.parallel, "parallel", 4, "--parallel")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "modelbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for name, p := range map[string]string{"a": c.a, "b": c.b} {
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		if err := os.Symlink(abs, filepath.Join(dir, name+".gguf")); err != nil {
			return err
		}
	}

	// Cold and warm on a server that keeps both loaded; then the switch
	// with room for one.
	var res results
	err = withServer(ctx, c, dir, "2", func(s *server) error {
		for i := 0; i < c.runs; i++ {
			if err := s.admin(ctx, "unload", "a"); err != nil {
				return err
			}
			if err := s.waitUnloaded(ctx, "a"); err != nil {
				return err
			}
			d, err := s.ttft(ctx, "a")
			if err != nil {
				return err
			}
			res.cold = append(res.cold, d)
		}
		for i := 0; i < c.runs; i++ {
			d, err := s.ttft(ctx, "a")
			if err != nil {
				return err
			}
			res.warm = append(res.warm, d)
		}
		if _, err := s.ttft(ctx, "b"); err != nil { // both loaded
			return err
		}
		return s.alternate(ctx, c.runs, &res.bothLoaded)
	})
	if err != nil {
		return err
	}
	err = withServer(ctx, c, dir, "1", func(s *server) error {
		if _, err := s.ttft(ctx, "a"); err != nil {
			return err
		}
		return s.alternate(ctx, c.runs, &res.switched)
	})
	if err != nil {
		return err
	}
	section := res.markdown(c)
	fmt.Fprintln(stdout, section)
	if c.out == "" {
		return nil
	}
	return benchmd.WriteSection(c.out, benchmd.Markers{Begin: beginMarker, End: endMarker}, section)
}

type results struct{ cold, warm, bothLoaded, switched []time.Duration }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func (r results) markdown(c config) string {
	load, _ := os.ReadFile("/proc/loadavg")
	var b strings.Builder
	fmt.Fprintf(&b, "## Several models: cold and warm time to first token, and the cost of a switch\n\n")
	fmt.Fprintf(&b, "`go run ./tools/modelbench` on %s (a) and %s (b), `--threads %d --ctx %d --parallel %d`, streamed chat "+
		"completions of 8 tokens, time to the first content chunk at the client, median of %d (load average at the end: %s).\n\n",
		filepath.Base(c.a), filepath.Base(c.b), c.threads, c.ctx, c.parallel, c.runs, strings.Join(strings.Fields(string(load))[:3], " "))
	b.WriteString("| what | TTFT p50 (ms) | min | max |\n|---|---:|---:|---:|\n")
	row := func(what string, ds []time.Duration) {
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f |\n", what, ms(median(ds)), ms(slices.Min(ds)), ms(slices.Max(ds)))
	}
	row("cold: a not loaded (its load included)", r.cold)
	row("warm: a loaded", r.warm)
	row("alternating a, b; both kept loaded (`--max-loaded-models 2`)", r.bothLoaded)
	row("alternating a, b; room for one (`--max-loaded-models 1`): each request unloads the other and loads its own", r.switched)
	fmt.Fprintf(&b, "\nThe cost of a switch is the last row less the one before it: %.0f ms.\n",
		float64(median(r.switched)-median(r.bothLoaded))/float64(time.Millisecond))
	return b.String()
}

type server struct {
	addr string
	p    *proc.Proc
	n    int // requests made
}

func withServer(ctx context.Context, c config, dir, maxLoaded string, f func(*server) error) error {
	addr, err := proc.FreeAddr()
	if err != nil {
		return err
	}
	data, err := os.MkdirTemp("", "modelbench-data-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	cmd := exec.Command(c.bin, "--models", dir, "--addr", addr, "--store", "memory", "--data-dir", data, "--api-key", apiKey,
		"--threads", fmt.Sprint(c.threads), "--ctx", fmt.Sprint(c.ctx), "--parallel", fmt.Sprint(c.parallel),
		"--max-loaded-models", maxLoaded, "--keep-alive", "-1s", "--temperature", "0", "--log-format", "json", "--kv-cache-ram", "0")
	var logs proc.Buffer
	cmd.Stderr = &logs
	p, err := proc.Start(cmd)
	if err != nil {
		return err
	}
	defer p.Kill()
	if err := p.WaitHTTP(ctx, "http://"+addr+"/health"); err != nil {
		return fmt.Errorf("server: %w\n%s", err, logs.String())
	}
	if err := f(&server{addr: addr, p: p}); err != nil {
		return fmt.Errorf("%w\n%s", err, logs.String())
	}
	return nil
}

func (s *server) do(ctx context.Context, method, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+s.addr+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	return http.DefaultClient.Do(req)
}

func (s *server) admin(ctx context.Context, verb, model string) error {
	res, err := s.do(ctx, "POST", "/admin/models/"+model+"/"+verb, "")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	switch {
	case res.StatusCode == 200:
	case verb == "unload" && strings.Contains(string(b), `"busy"`):
		// The last reply's lease is released just after its client saw
		// the end: the model unloads when it is (see waitUnloaded).
	default:
		return fmt.Errorf("%s %s: %d %s", verb, model, res.StatusCode, b)
	}
	return nil
}

func (s *server) waitUnloaded(ctx context.Context, model string) error {
	for ctx.Err() == nil {
		res, err := s.do(ctx, "GET", "/health", "")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), `{"name":"`+model+`","state":"unloaded"`) {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ctx.Err()
}

// ttft streams a short greedy reply from model and returns the time to
// its first content chunk.
func (s *server) ttft(ctx context.Context, model string) (time.Duration, error) {
	s.n++ // a new prompt each time (its first token differs), so no request finds its whole prompt cached
	start := time.Now()
	res, err := s.do(ctx, "POST", "/v1/chat/completions", fmt.Sprintf(
		`{"model":%q,"messages":[{"role":"user","content":"%d. Tell me a story about a dog."}],"max_tokens":8,"temperature":0,"stream":true}`, model, s.n))
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		return 0, fmt.Errorf("%s: %d %s", model, res.StatusCode, b)
	}
	sc := bufio.NewScanner(res.Body)
	first := time.Duration(0)
	for sc.Scan() {
		line := sc.Text()
		if first == 0 && strings.HasPrefix(line, "data: {") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			first = time.Since(start)
		}
	}
	if first == 0 {
		return 0, fmt.Errorf("%s: no content", model)
	}
	return first, sc.Err()
}

// alternate asks for b then a, runs times, and appends each time to first
// token to dst: every request switches the model.
func (s *server) alternate(ctx context.Context, runs int, dst *[]time.Duration) error {
	for range runs {
		for _, m := range []string{"b", "a"} {
			d, err := s.ttft(ctx, m)
			if err != nil {
				return err
			}
			*dst = append(*dst, d)
		}
	}
	return nil
}
