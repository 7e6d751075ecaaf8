// Command kvbench measures the swap of sessions' KV state
// (--kv-cache-ram and --kv-cache-disk) on bin/parley, and writes a
// "## KV swap" section into BENCHMARKS.md between its own markers:
//
//  1. conversations: many sessions of several turns each over few slots
//     (default 32 x 10 turns over --parallel 4), with the swap off and on:
//     prompt tokens evaluated per turn against the turn's new tokens, and
//     time to first token;
//
//  2. restart: one long conversation (about 2,000 tokens) built on a server
//     that is then killed with SIGKILL; the next turn's time to first token
//     on a restarted server with the swap's files, against one without them
//     (a cold recompute of the whole history).
//
//     go run ./tools/kvbench -parley bin/parley            # the synthetic 135M model (go run ./tools/mkgguf)
//     go run ./tools/kvbench -conversations 4 -turns 3     # a quick look
//
// Every server runs on loopback and is stopped whatever happens; -timeout
// bounds the whole run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/tools/internal/benchmd"
	"github.com/parley-chat/parley/tools/internal/harness"
)

const (
	beginMarker = "<!-- tools/kvbench: generated section, rewritten by `go run ./tools/kvbench` -->"
	endMarker   = "<!-- /tools/kvbench -->"
)

func main() { harness.Main("kvbench", run) }

type config struct {
	bin, model, out                string
	conversations, turns, parallel int
	threads, ctx, replyTokens      int
	longTokens, restartRuns        int
	timeout                        time.Duration
	skipConversations, skipRestart bool
	swapArgs, noSwapArgs           []string
}

func parse(args []string) (config, error) {
	var c config
	home, _ := os.UserHomeDir()
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	fs.StringVar(&c.bin, "parley", "bin/parley", "the server binary")
	fs.StringVar(&c.model, "model", filepath.Join(home, ".cache/parley/models/synthetic-smollm2-135m-f16.gguf"), "GGUF model")
	fs.StringVar(&c.out, "out", "BENCHMARKS.md", "file whose KV swap section is rewritten (\"\" = print only)")
	fs.IntVar(&c.conversations, "conversations", 32, "concurrent conversations")
	fs.IntVar(&c.turns, "turns", 10, "turns per conversation")
	fs.IntVar(&c.parallel, "parallel", 4, "--parallel of the server")
	fs.IntVar(&c.threads, "threads", 2, "--threads of the server")
	fs.IntVar(&c.ctx, "ctx", 2048, "--ctx of the server")
	fs.IntVar(&c.replyTokens, "reply-tokens", 32, "reply cap (max_tokens)")
	fs.IntVar(&c.longTokens, "long-tokens", 2000, "tokens of the long conversation before the restart")
	fs.IntVar(&c.restartRuns, "restart-runs", 3, "restarts measured each way (median reported)")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Minute, "bound on the whole run")
	fs.BoolVar(&c.skipConversations, "skip-conversations", false, "measure the restart only")
	fs.BoolVar(&c.skipRestart, "skip-restart", false, "measure the conversations only")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.swapArgs = []string{"--kv-cache-ram", "1GiB", "--kv-cache-disk", "4GiB"}
	c.noSwapArgs = []string{"--kv-cache-ram", "0", "--kv-cache-disk", "0"}
	return c, nil
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parse(args)
	if err != nil {
		return err
	}
	if _, err := os.Stat(cfg.model); err != nil {
		return fmt.Errorf("model: %w (make it with go run ./tools/mkgguf)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	start := time.Now()
	res := results{cfg: cfg}
	// The section is written after each stage, so what was measured before
	// a deadline is kept. The cheap stages come first.
	write := func() error {
		res.took = time.Since(start)
		md := res.markdown()
		fmt.Fprintln(stdout, md)
		if cfg.out == "" {
			return nil
		}
		return benchmd.WriteSection(cfg.out, benchmd.Markers{Begin: beginMarker, End: endMarker}, md)
	}
	convs := func(swap bool) error {
		t0 := time.Now()
		r, err := conversations(ctx, cfg, swap)
		if err != nil {
			return fmt.Errorf("conversations (swap %v): %w", swap, err)
		}
		r.took = time.Since(t0)
		fmt.Fprintf(stdout, "conversations, swap %v: %s\n", swap, r.summary())
		res.conv = append(res.conv, r)
		return write()
	}
	if !cfg.skipConversations {
		if err := convs(true); err != nil {
			return err
		}
	}
	if !cfg.skipRestart {
		r, err := restart(ctx, cfg, stdout)
		if err != nil {
			return fmt.Errorf("restart: %w", err)
		}
		res.restart = &r
		if err := write(); err != nil {
			return err
		}
	}
	if !cfg.skipConversations {
		return convs(false)
	}
	return nil
}

// server is one run of the binary.
type server struct {
	*harness.Server
	addr   string
	stderr proc.Buffer
}

// startServer runs the binary on dataDir with the swap on or off and waits
// until the model is loaded.
func startServer(ctx context.Context, cfg config, dataDir string, swap bool) (*server, error) {
	args := []string{"--model", cfg.model, "--log-format", "json", "--log-level", "warn",
		"--threads", fmt.Sprint(cfg.threads), "--ctx", fmt.Sprint(cfg.ctx), "--parallel", fmt.Sprint(cfg.parallel),
		"--temperature", "0", "--repeat-penalty", "1", "--max-tokens", fmt.Sprint(cfg.replyTokens),
		"--store", "bolt", "--data-dir", dataDir, "--max-prompt-tokens", "-1", "--max-queued-prompts", "4"}
	args = append(args, harness.OneClientLoad(1000)...)
	if swap {
		args = append(args, cfg.swapArgs...)
	} else {
		args = append(args, cfg.noSwapArgs...)
	}
	s := &server{}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := harness.Start(wctx, cfg.bin, args, []string{"XDG_DATA_HOME=" + dataDir}, &s.stderr)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, s.stderr.String())
	}
	s.Server, s.addr = srv, srv.Addr
	return s, nil
}

// stop ends the server with SIGTERM (SIGKILL after 30 s).
func (s *server) stop() { s.Stop(30 * time.Second) }
