package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/jsonmode"
)

// turnResult is one turn as the client saw it.
type turnResult struct {
	turn      int // 1-based
	ttft      time.Duration
	prompt    int
	cached    int
	newTokens int // prompt tokens the last turn did not leave in the cache (-1 on turn 1)
}

func (t turnResult) evaluated() int { return t.prompt - t.cached }

// convResult is one run of the conversations workload.
type convResult struct {
	swap  bool
	turns []turnResult
	took  time.Duration
	stats map[string]float64 // the server's parley_kv_* and prompt counters at the end
}

// session is one WebSocket conversation.
type session struct {
	ws  *websocket.Conn
	id  string
	msg int // messages in its history
}

func dial(ctx context.Context, addr, query string) (*session, error) {
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second}
	ws, _, err := d.DialContext(ctx, "ws://"+addr+"/ws?format=json"+query, nil)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	s := &session{ws: ws}
	context.AfterFunc(ctx, func() { ws.Close() }) // a deadline or a signal ends every read
	m, err := s.read()
	if err != nil || m.Type != "session" {
		ws.Close()
		return nil, fmt.Errorf("first message %+v: %v", m, err)
	}
	s.id, s.msg = m.SessionID(), len(m.Messages)
	return s, nil
}

func (s *session) read() (jsonmode.Message, error) {
	s.ws.SetReadDeadline(time.Now().Add(10 * time.Minute))
	var m jsonmode.Message
	err := s.ws.ReadJSON(&m)
	return m, err
}

// turn sends prompt and returns the done message and the time to the first token.
func (s *session) turn(prompt string) (jsonmode.Message, time.Duration, error) {
	t0 := time.Now()
	if err := s.ws.WriteJSON(map[string]any{"type": "prompt", "content": prompt}); err != nil {
		return jsonmode.Message{}, 0, err
	}
	var ttft time.Duration
	for {
		m, err := s.read()
		if err != nil {
			return m, 0, err
		}
		switch m.Type {
		case "token":
			if ttft == 0 {
				ttft = time.Since(t0)
			}
		case "done":
			if m.FinishReason == "error" {
				return m, 0, fmt.Errorf("reply ended with an error: %s", m.Message)
			}
			s.msg += 2
			return m, ttft, nil
		default:
			return m, 0, fmt.Errorf("during a reply: %+v", m)
		}
	}
}

// conversations runs cfg.conversations sessions of cfg.turns turns each,
// all at once, on a fresh server with the swap on or off.
func conversations(ctx context.Context, cfg config, swap bool) (convResult, error) {
	dir, err := os.MkdirTemp("", "kvbench-*")
	if err != nil {
		return convResult{}, err
	}
	defer os.RemoveAll(dir)
	srv, err := startServer(ctx, cfg, dir, swap)
	if err != nil {
		return convResult{}, err
	}
	defer srv.stop()
	res := convResult{swap: swap}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, cfg.conversations)
	for c := range cfg.conversations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := dial(ctx, srv.addr, "")
			if err != nil {
				errs <- err
				return
			}
			defer s.ws.Close()
			prev := 0
			for t := 1; t <= cfg.turns && ctx.Err() == nil; t++ {
				m, ttft, err := s.turn(fmt.Sprintf("Conversation %d, turn %d: and what did the little bird do next?", c+1, t))
				if err != nil {
					errs <- fmt.Errorf("conversation %d turn %d: %w", c+1, t, err)
					return
				}
				tr := turnResult{turn: t, ttft: ttft, prompt: m.Usage.PromptTokens, cached: m.Usage.CachedPromptTokens, newTokens: -1}
				if t > 1 {
					tr.newTokens = m.Usage.PromptTokens - prev
				}
				prev = m.Usage.PromptTokens + m.Usage.CompletionTokens
				mu.Lock()
				res.turns = append(res.turns, tr)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.stats, err = scrape(srv.addr)
	return res, err
}

var sampleRE = regexp.MustCompile(`(?m)^(parley_(?:kv_|prompt_tokens_)[a-z_]+(?:\{[^}]*\})?) (\S+)$`)

// scrape reads the server's parley_kv_* and prompt-token counters.
func scrape(addr string) (map[string]float64, error) {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range sampleRE.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		out[m[1]] = v
	}
	return out, nil
}

// restartResult is the long conversation's next turn after a restart.
type restartResult struct {
	historyTokens        int
	warm, cold           []time.Duration // TTFT of each run
	warmCached, coldEval int             // of the last run
	warmEval             int
	build                time.Duration
}

// restart builds one long conversation on a server with the swap on, kills
// it with SIGKILL once its state is on disk, then measures the next turn on
// servers restarted from copies of that data directory: with the swap's
// files, and with the swap off (a cold recompute).
func restart(ctx context.Context, cfg config, log io.Writer) (restartResult, error) {
	var r restartResult
	base, err := os.MkdirTemp("", "kvbench-restart-*")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(base)
	snap := filepath.Join(base, "snap")
	t0 := time.Now()
	srv, err := startServer(ctx, cfg, snap, true)
	if err != nil {
		return r, err
	}
	defer srv.Kill()
	s, err := dial(ctx, srv.addr, "")
	if err != nil {
		return r, err
	}
	user := strings.Repeat("The little bird flew over the green hill and sang a song to the sun. ", 8)
	// Turns until the next one would pass cfg.longTokens or come near the
	// window (where the oldest turns would be dropped and the prefix with them).
	limit := min(cfg.longTokens, cfg.ctx-cfg.replyTokens-40)
	turns, growth := 0, 0
	for r.historyTokens+growth <= limit {
		m, _, err := s.turn(fmt.Sprintf("Part %d. %s", turns+1, user))
		if err != nil {
			return r, err
		}
		turns++
		h := m.Usage.PromptTokens + m.Usage.CompletionTokens
		growth, r.historyTokens = h-r.historyTokens, h
	}
	s.ws.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := scrape(srv.addr)
		if err != nil {
			return r, err
		}
		// The last turn's state is on disk: the idle pass left no slot
		// unsaved and nothing is queued for the disk.
		if st["parley_kv_disk_writes_total"] >= 1 && st["parley_kv_unsaved_slots"] == 0 && st["parley_kv_disk_pending"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the state did not reach the disk: %v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv.Cmd.Process.Signal(syscall.SIGKILL)
	srv.WaitFor(10 * time.Second)
	r.build = time.Since(t0)
	fmt.Fprintf(log, "long conversation: %d turns, %d tokens, built in %s\n", turns, r.historyTokens, r.build.Round(time.Second))

	for i := range cfg.restartRuns {
		for _, swap := range []bool{true, false} {
			dir := filepath.Join(base, fmt.Sprintf("run%d-%v", i, swap))
			if err := copyDir(snap, dir, swap); err != nil {
				return r, err
			}
			m, ttft, err := nextTurn(ctx, cfg, dir, s.id, swap)
			os.RemoveAll(dir)
			if err != nil {
				return r, err
			}
			if swap {
				r.warm = append(r.warm, ttft)
				r.warmCached, r.warmEval = m.Usage.CachedPromptTokens, m.Usage.PromptTokens-m.Usage.CachedPromptTokens
			} else {
				r.cold = append(r.cold, ttft)
				r.coldEval = m.Usage.PromptTokens - m.Usage.CachedPromptTokens
			}
			fmt.Fprintf(log, "restart run %d, swap %v: ttft %s, prompt %d, cached %d\n", i+1, swap, ttft.Round(time.Millisecond),
				m.Usage.PromptTokens, m.Usage.CachedPromptTokens)
		}
	}
	return r, nil
}

// nextTurn starts a server on dir, resumes session id and runs one turn.
func nextTurn(ctx context.Context, cfg config, dir, id string, swap bool) (jsonmode.Message, time.Duration, error) {
	srv, err := startServer(ctx, cfg, dir, swap)
	if err != nil {
		return jsonmode.Message{}, 0, err
	}
	defer srv.stop()
	s, err := dial(ctx, srv.addr, "&session="+id)
	if err != nil {
		return jsonmode.Message{}, 0, err
	}
	defer s.ws.Close()
	return s.turn("And what happened at the very end?")
}

// copyDir copies the data directory src to dst: the session database,
// and the swap's files when withKV.
func copyDir(src, dst string, withKV bool) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if !withKV && (rel == "kvcache" || strings.HasPrefix(rel, "kvcache"+string(filepath.Separator))) {
			return filepath.SkipDir
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	})
}
