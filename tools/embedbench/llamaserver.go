package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/parley-chat/parley/tools/internal/harness"
)

// llamaServerArgs are llama-server's arguments for the model and settings
// of c: the same threads; one slot per sequence Parley puts in a batch
// (-seqs), each with a micro-batch of context (-ubatch: an encoder's input
// must fit one micro-batch in both); batch and micro-batch of -ubatch
// tokens, so that a llama.cpp batch holds what Parley's holds; flash
// attention off, as Parley runs on a CPU.
func llamaServerArgs(c config) []string {
	seqs, ubatch := c.cfg.CacheSlots, c.cfg.BatchSize
	args := []string{
		"--model", c.cfg.Path,
		"--threads", strconv.Itoa(c.cfg.Threads), "--threads-batch", strconv.Itoa(c.cfg.Threads),
		"--parallel", strconv.Itoa(seqs), "--ctx-size", strconv.Itoa(seqs * ubatch),
		"--batch-size", strconv.Itoa(ubatch), "--ubatch-size", strconv.Itoa(ubatch),
		"--flash-attn", "off", "--no-webui",
	}
	if c.rerank {
		return append(args, "--reranking")
	}
	return append(args, "--embedding")
}

// startLlamaServer starts c.llamaServer on c's model and settings and says
// which build it is and where its log goes.
func startLlamaServer(ctx context.Context, c config, out io.Writer) (*harness.Server, error) {
	log, err := os.CreateTemp("", "embedbench-llama-server-*.log")
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child holds its own copy of the descriptor
	args := llamaServerArgs(c)
	fmt.Fprintf(out, "llama-server %s: %s (log %s)\n", llamaServerVersion(ctx, c.llamaServer), strings.Join(args, " "), log.Name())
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return harness.StartLlamaServer(sctx, c.llamaServer, args, log)
}

// llamaServerVersion is what `llama-server --version` says of its build
// ("N (commit)"), or "" when it says nothing.
func llamaServerVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, _ := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// compareTolerance is how far llama-server's outputs may be from Parley's
// on the same inputs: the float rounding of two builds of the same kernels
// (the engines' tests hold Parley to llama.cpp's own embedding tool within
// the same bound).
const compareTolerance = 1e-4

// compare computes texts' outputs with parley and with peer and prints
// the largest difference between them; it returns that difference, and an
// error when the outputs differ in number or length.
func compare(ctx context.Context, out io.Writer, parley, peer embedder, texts []string) (float64, error) {
	want, err := parley.outputs(ctx, texts)
	if err != nil {
		return 0, fmt.Errorf("outputs: %w", err)
	}
	got, err := peer.outputs(ctx, texts)
	if err != nil {
		return 0, fmt.Errorf("llama-server's outputs: %w", err)
	}
	d, err := maxDiff(want, got)
	if err != nil {
		return 0, err
	}
	verdict := "within"
	if d > compareTolerance {
		verdict = "NOT within"
	}
	fmt.Fprintf(out, "llama-server's outputs against Parley's on %d inputs of %d values: largest difference %.2g, %s %g\n",
		len(texts), len(want[0]), d, verdict, compareTolerance)
	return d, nil
}

// maxDiff is the largest absolute difference between the values of a and
// b, which must be the same number of vectors of the same lengths.
func maxDiff(a, b [][]float32) (float64, error) {
	if len(a) != len(b) {
		return 0, fmt.Errorf("%d outputs against %d", len(a), len(b))
	}
	var d float64
	for i := range a {
		if len(a[i]) != len(b[i]) || len(a[i]) == 0 {
			return 0, fmt.Errorf("output %d: %d values against %d", i, len(a[i]), len(b[i]))
		}
		for j := range a[i] {
			d = math.Max(d, math.Abs(float64(a[i][j])-float64(b[i][j])))
		}
	}
	return d, nil
}
