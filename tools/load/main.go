// Command load is Parley's bounded load test: it starts bin/parley on a
// free loopback port, opens many WebSocket sessions, keeps some of them
// generating for a fixed time, and then checks that every session is
// intact, that the only refusals were the configured caps, and that the
// server exits 0 on SIGTERM. It reports the server's memory (VmRSS from
// /proc) with no connections, with every connection open and idle, and at
// its peak under load, and so the memory per idle connection; and writes a
// "## Load" section into BENCHMARKS.md (between its own markers, leaving
// the other sections as they are).
//
//	go run ./tools/load                         # 500 sessions, 32 generating, 60 s
//	go run ./tools/load -conns 50 -duration 5s  # a quick look
//
// The run is bounded: -duration of load, and -timeout for everything; it
// talks to loopback only and stops the server it started whatever happens.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/tools/internal/benchmd"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() { harness.Main("load", run) }

type config struct {
	bin, model, out string
	note            string // a line for the report (what was measured, if not HEAD)
	conns, active   int    // sessions open; of them, generating
	parallel        int    // parley --parallel
	threads         int    // parley --threads
	maxTokens       int    // reply cap of each turn
	probes          int    // connections attempted past the cap
	duration        time.Duration
	timeout         time.Duration
}

func parseFlags(args []string) (config, error) {
	root := repo.WorkingRoot()
	var c config
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.StringVar(&c.bin, "bin", filepath.Join(root, "bin", "parley"), "parley binary (make build)")
	fs.StringVar(&c.model, "model", repo.TestModel(root), "GGUF model")
	fs.StringVar(&c.out, "out", filepath.Join(root, "BENCHMARKS.md"), "markdown file for the results (\"\" = none)")
	fs.StringVar(&c.note, "note", "", "a note printed under the results (e.g. which build was measured)")
	fs.IntVar(&c.conns, "conns", 500, "WebSocket sessions held open (also the server's --max-conns)")
	fs.IntVar(&c.active, "active", 32, "of them, sessions that generate without pause")
	fs.IntVar(&c.parallel, "parallel", 4, "parley --parallel (slots)")
	fs.IntVar(&c.threads, "threads", runtime.NumCPU(), "parley --threads")
	fs.IntVar(&c.maxTokens, "max-tokens", 64, "reply cap of each turn")
	fs.IntVar(&c.probes, "probes", 10, "connections attempted past --max-conns, each of which must get 503")
	fs.DurationVar(&c.duration, "duration", time.Minute, "how long the active sessions generate")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "deadline of the whole run")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.conns < 1 || c.active < 0 || c.active > c.conns {
		return c, fmt.Errorf("want 0 <= -active <= -conns and -conns >= 1")
	}
	return c, nil
}

// results is everything the run measured.
type results struct {
	cfg                         config
	rssBase, rssIdle, rssPeak   int64 // KiB
	openTime                    time.Duration
	turns, tokens               int64
	ttfts                       []time.Duration
	loadTime                    time.Duration
	probeRefused, probeAccepted int
	errors                      map[string]int // unexpected: code or failure -> count
	dropped                     int            // connections the server closed during the load
	verified, corrupt           int            // sessions checked after the load
	exitErr                     error
	start                       time.Time
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if _, err := os.Stat(cfg.bin); err != nil {
		return fmt.Errorf("parley binary: %w (run make build)", err)
	}
	res := &results{cfg: cfg, errors: map[string]int{}, start: time.Now()}

	srv, err := startServer(ctx, cfg)
	if err != nil {
		return err
	}
	defer srv.kill()
	fmt.Fprintf(stdout, "parley pid %d on %s\n", srv.Cmd.Process.Pid, srv.addr)
	time.Sleep(500 * time.Millisecond) // let the heap settle after the model load
	if res.rssBase, err = srv.rss(); err != nil {
		return err
	}

	// Open every session; each gets a reader that answers pings and
	// notices a close.
	t0 := time.Now()
	sessions, err := openAll(ctx, srv.addr, cfg.conns)
	defer func() {
		for _, s := range sessions {
			s.close()
		}
	}()
	if err != nil {
		return err
	}
	res.openTime = time.Since(t0)
	fmt.Fprintf(stdout, "%d sessions open in %v\n", len(sessions), res.openTime.Round(time.Millisecond))
	time.Sleep(time.Second)
	if res.rssIdle, err = srv.rss(); err != nil {
		return err
	}

	// Past the cap: each probe must be refused before the upgrade.
	probe(ctx, srv.addr, cfg.probes, res)

	// The load: the first cfg.active sessions generate until the time is up.
	runLoad(ctx, srv, sessions, res)
	fmt.Fprintf(stdout, "load done: %d turns, %d tokens in %v\n", res.turns, res.tokens, res.loadTime.Round(time.Millisecond))

	// Every session intact: close the connections, resume each session and
	// compare its history with the turns this side saw complete.
	for _, s := range sessions {
		s.close()
	}
	res.verified, res.corrupt = verifyAll(ctx, srv.addr, sessions, res.errors)

	res.exitErr = srv.Terminate(30 * time.Second)
	report(stdout, res)
	if cfg.out != "" {
		if err := benchmd.WriteSection(cfg.out, benchmd.Markers{Begin: beginMarker, End: endMarker}, markdown(res)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", cfg.out)
	}
	if n := len(res.errors) + res.dropped + res.corrupt + res.probeAccepted; n > 0 || res.exitErr != nil {
		return fmt.Errorf("load test failed: %d unexpected errors, %d dropped, %d corrupt sessions, %d probes admitted, exit %v",
			len(res.errors), res.dropped, res.corrupt, res.probeAccepted, res.exitErr)
	}
	return nil
}

// probe attempts n connections past the cap, each of which must be
// refused with 503 before the upgrade; res counts how each went.
func probe(ctx context.Context, addr string, n int, res *results) {
	for range n {
		ws, r, err := websocket.DefaultDialer.DialContext(ctx, "ws://"+addr+"/ws", nil)
		switch {
		case err == nil:
			res.probeAccepted++
			ws.Close()
		case r != nil && r.StatusCode == http.StatusServiceUnavailable:
			res.probeRefused++
		default:
			res.errors[fmt.Sprintf("probe: %v", err)]++
		}
	}
}

// runLoad lets the first res.cfg.active sessions generate until the
// duration is up, sampling the server's RSS, then adds up what every
// session saw into res.
func runLoad(ctx context.Context, srv *server, sessions []*sess, res *results) {
	loadCtx, stopLoad := context.WithTimeout(ctx, res.cfg.duration)
	peak := sampleRSS(loadCtx, srv)
	t1 := time.Now()
	var wg sync.WaitGroup
	for _, s := range sessions[:res.cfg.active] {
		wg.Go(func() { s.generate(loadCtx, res.cfg.maxTokens) })
	}
	wg.Wait()
	stopLoad()
	res.loadTime = time.Since(t1)
	res.rssPeak = max(<-peak, res.rssIdle)
	for _, s := range sessions {
		res.turns += int64(len(s.turns))
		res.tokens += s.tokens
		res.ttfts = append(res.ttfts, s.ttfts...)
		for k, n := range s.errors {
			res.errors[k] += n
		}
		if s.closedEarly() {
			res.dropped++
		}
	}
}

// server is the parley process under load.
type server struct {
	*harness.Server
	addr    string
	dataDir string
	logFile *os.File
}

func startServer(ctx context.Context, cfg config) (*server, error) {
	dir, err := os.MkdirTemp("", "parley-load-")
	if err != nil {
		return nil, err
	}
	caps := strconv.Itoa(cfg.conns)
	args := []string{"--model", cfg.model,
		"--store", "bolt", "--data-dir", dir,
		"--parallel", strconv.Itoa(cfg.parallel), "--threads", strconv.Itoa(cfg.threads),
		"--ctx", "512", "--max-tokens", strconv.Itoa(cfg.maxTokens),
		// The caps the load is meant to fit under: every session open,
		// every active one prompting as fast as it is answered, all of
		// them queued behind the slots at once.
		"--max-conns", caps, "--queue", caps,
		"--log-format", "json", "--log-level", "warn"}
	args = append(args, harness.OneClientLoad(cfg.conns)...)
	logPath := filepath.Join(dir, "parley.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	srv, err := harness.Start(ctx, cfg.bin, args, nil, logFile)
	if err != nil {
		logFile.Close() // the data folder stays, for its log
		return nil, fmt.Errorf("%w (log: %s)", err, logPath)
	}
	return &server{Server: srv, addr: srv.Addr, dataDir: dir, logFile: logFile}, nil
}

// rss reads the server's resident set size, in KiB.
func (s *server) rss() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("read RSS: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, errors.New("read RSS: no VmRSS line")
}

// sampleRSS samples the RSS every 200 ms until ctx ends, then sends the peak.
func sampleRSS(ctx context.Context, s *server) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := s.rss(); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-ctx.Done():
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// kill ends the process if it still runs and removes its data.
func (s *server) kill() {
	s.Kill()
	s.logFile.Close()
	os.RemoveAll(s.dataDir)
}

// turn is one completed prompt and reply, as the client saw them.
type turn struct{ prompt, reply string }

// sess is one WebSocket session. Its reader goroutine owns the socket's
// reads (so pings are answered even while idle) and hands messages to
// whoever is generating.
type sess struct {
	id     string
	ws     *websocket.Conn
	msgs   chan jsonmode.Message
	stop   chan struct{} // closed by close: the reader stops handing over messages
	done   chan struct{} // closed when the reader ends
	closed atomic.Bool   // we closed it (as opposed to the server)

	turns  []turn
	tokens int64
	ttfts  []time.Duration
	errors map[string]int
}

func dialSession(ctx context.Context, addr, query string) (*sess, jsonmode.Message, error) {
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, "ws://"+addr+"/ws?format=json"+query, nil)
	if err != nil {
		return nil, jsonmode.Message{}, err
	}
	s := &sess{ws: ws, msgs: make(chan jsonmode.Message, 64), stop: make(chan struct{}), done: make(chan struct{}), errors: map[string]int{}}
	go s.read()
	select {
	case m, ok := <-s.msgs:
		if !ok || m.Type != "session" {
			s.close()
			return nil, m, fmt.Errorf("first message %+v", m)
		}
		s.id = m.SessionID()
		return s, m, nil
	case <-ctx.Done():
		s.close()
		return nil, jsonmode.Message{}, ctx.Err()
	}
}

func (s *sess) read() {
	defer close(s.done)
	defer close(s.msgs)
	for {
		var m jsonmode.Message
		if err := s.ws.ReadJSON(&m); err != nil {
			return
		}
		select {
		case s.msgs <- m:
		case <-s.stop:
			return
		}
	}
}

func (s *sess) close() {
	if s.closed.CompareAndSwap(false, true) {
		close(s.stop)
		s.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		s.ws.Close()
		<-s.done
	}
}

// closedEarly reports whether the server ended the connection before we did.
func (s *sess) closedEarly() bool {
	select {
	case <-s.done:
		return !s.closed.Load()
	default:
		return false
	}
}

// generate sends prompts one after another until ctx ends, recording each
// completed turn; a turn in flight when ctx ends is finished first.
func (s *sess) generate(ctx context.Context, maxTokens int) {
	for n := 1; ctx.Err() == nil; n++ {
		prompt := fmt.Sprintf("Lily and Tom played game %d in the park", n)
		sent := time.Now()
		if err := s.ws.WriteJSON(map[string]any{"type": "prompt", "content": prompt, "params": map[string]any{"max_tokens": maxTokens}}); err != nil {
			s.errors["write: "+err.Error()]++
			return
		}
		first := true
		for {
			m, ok := <-s.msgs
			if !ok {
				s.errors["connection closed by the server"]++
				return
			}
			if m.Type == "token" && first {
				s.ttfts = append(s.ttfts, time.Since(sent))
				first = false
			}
			if m.Type == "error" {
				s.errors["error "+m.Code+": "+m.Message]++
				break
			}
			if m.Type == "done" {
				if m.FinishReason == "error" {
					s.errors["reply failed"]++
					break
				}
				s.turns = append(s.turns, turn{prompt, m.Content})
				s.tokens += int64(m.Usage.CompletionTokens)
				break
			}
		}
	}
}

// openAll opens n sessions, 32 handshakes at a time.
func openAll(ctx context.Context, addr string, n int) ([]*sess, error) {
	out := make([]*sess, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, _, err := dialSession(ctx, addr, "")
			if err != nil {
				errs <- fmt.Errorf("open session %d: %w", i, err)
				return
			}
			out[i] = s
		})
	}
	wg.Wait()
	close(errs)
	var opened []*sess
	for _, s := range out {
		if s != nil {
			opened = append(opened, s)
		}
	}
	return opened, <-errs // nil when every session opened
}

// verifyAll resumes every session and compares its history with the turns
// its client saw complete. It returns how many matched and how many did not.
func verifyAll(ctx context.Context, addr string, sessions []*sess, errs map[string]int) (ok, bad int) {
	var mu sync.Mutex
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, s := range sessions {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// Retry briefly: the closed connections give their places
			// under --max-conns back a moment after they close.
			var r *sess
			var m jsonmode.Message
			var err error
			for try := 0; try < 50; try++ {
				if r, m, err = dialSession(ctx, addr, "&session="+s.id); err == nil || ctx.Err() != nil || notFound(err) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			// A session that never completed a turn was never written, and
			// the server stores sessions at their first write: it must be gone.
			match := (err == nil && len(m.Messages) == 2*len(s.turns)) || (len(s.turns) == 0 && notFound(err))
			if match {
				// The store may drop the oldest turns past its byte cap;
				// at this scale it does not, so every turn must be there.
				for i, t := range s.turns {
					u, a := m.Messages[2*i], m.Messages[2*i+1]
					if u.Role != "user" || u.Content != t.prompt || a.Role != "assistant" || a.Content != t.reply {
						match = false
						break
					}
				}
			}
			if r != nil {
				r.close()
			}
			mu.Lock()
			defer mu.Unlock()
			if match {
				ok++
				return
			}
			bad++
			if err != nil && !notFound(err) {
				errs["verify: "+err.Error()]++
			}
		})
	}
	wg.Wait()
	return ok, bad
}

// notFound reports whether dialSession failed because the server does not
// know the session.
func notFound(err error) bool { return err != nil && strings.Contains(err.Error(), "not_found") }

func report(w io.Writer, r *results) {
	fmt.Fprintln(w)
	fmt.Fprint(w, markdown(r))
}

func markdown(r *results) string {
	var b strings.Builder
	c := r.cfg
	f := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	perConn := float64(r.rssIdle-r.rssBase) / float64(max(c.conns, 1))
	f("## Load (tools/load)\n\n")
	f("`go run ./tools/load -conns %d -active %d -duration %v` on %s: bin/parley on stories260K, `--parallel %d --threads %d --ctx 512 --max-tokens %d`, bolt store; ",
		c.conns, c.active, c.duration, r.start.UTC().Format("2006-01-02"), c.parallel, c.threads, c.maxTokens)
	f("%d WebSocket sessions (JSON mode) held open, %d of them prompting back to back, the rest idle; %d connections attempted past `--max-conns %d`. Loopback, %d CPUs shared with other work.\n\n",
		c.conns, c.active, c.probes, c.conns, runtime.NumCPU())
	f("| measure | value |\n|---|---:|\n")
	f("| server RSS, no connections | %.1f MiB |\n", float64(r.rssBase)/1024)
	f("| server RSS, %d idle connections | %.1f MiB |\n", c.conns, float64(r.rssIdle)/1024)
	f("| **RSS per idle connection** | **%.1f KiB** |\n", perConn)
	f("| server RSS, peak under load | %.1f MiB |\n", float64(r.rssPeak)/1024)
	f("| time to open %d sessions | %v |\n", c.conns, r.openTime.Round(time.Millisecond))
	f("| turns completed in %v | %d |\n", r.loadTime.Round(time.Second), r.turns)
	f("| tokens generated | %d (%.0f tok/s aggregate) |\n", r.tokens, float64(r.tokens)/max(r.loadTime.Seconds(), 1e-9))
	f("| time to first token p50 / p95 | %v / %v |\n", harness.Percentile(r.ttfts, 50).Round(time.Millisecond), harness.Percentile(r.ttfts, 95).Round(time.Millisecond))
	f("| connections past the cap refused (503) | %d of %d |\n", r.probeRefused, c.probes)
	f("| unexpected errors | %d |\n", sum(r.errors))
	f("| connections dropped by the server | %d |\n", r.dropped)
	f("| sessions intact afterwards (history = turns seen) | %d of %d |\n", r.verified, r.verified+r.corrupt)
	exit := "0"
	if r.exitErr != nil {
		exit = r.exitErr.Error()
	}
	f("| exit status after SIGTERM | %s |\n", exit)
	if c.note != "" {
		f("\nNote: %s\n", c.note)
	}
	if len(r.errors) > 0 {
		f("\nUnexpected errors:\n\n")
		keys := make([]string, 0, len(r.errors))
		for k := range r.errors {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			f("- %d × %s\n", r.errors[k], strings.ReplaceAll(k, "|", `\|`))
		}
	}
	return b.String()
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Markers of this tool's section of BENCHMARKS.md; the rest of the file is
// left as it is.
const (
	beginMarker = "<!-- tools/load: generated section, rewritten by `go run ./tools/load` -->"
	endMarker   = "<!-- /tools/load -->"
)
