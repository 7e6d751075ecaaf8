package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
)

func TestFitWords(t *testing.T) {
	// Two tokens a word and two more for the input's special tokens.
	count := func(s string) (int, error) { return 2*len(strings.Fields(s)) + 2, nil }
	for _, c := range []struct {
		text string
		max  int
		want string
	}{
		{"a b c", 8, "a b c"},
		{"a b c", 100, "a b c"},
		{"a b c d e f", 8, "a b c"},
		{"a b c d e f", 9, "a b c"},
		{"a b c d e f", 13, "a b c d e"},
		{"a b c", 3, ""},
	} {
		got, err := fitWords(c.text, c.max, count)
		if err != nil || got != c.want {
			t.Errorf("fitWords(%q, %d) = %q, %v; want %q", c.text, c.max, got, err, c.want)
		}
	}
	bad := errors.New("refused")
	if _, err := fitWords("a b c", 4, func(string) (int, error) { return 0, bad }); !errors.Is(err, bad) {
		t.Errorf("a count's error: got %v", err)
	}
}

func TestMaxDiff(t *testing.T) {
	d, err := maxDiff([][]float32{{1, 2}, {3}}, [][]float32{{1, 2.5}, {2}})
	if err != nil || d != 1 {
		t.Errorf("maxDiff = %v, %v; want 1", d, err)
	}
	for _, b := range [][][]float32{{{1, 2}}, {{1, 2}, {3, 4}}, {{1}, {3}}} {
		if _, err := maxDiff([][]float32{{1, 2}, {3}}, b); err == nil {
			t.Errorf("outputs of other shapes %v: want an error", b)
		}
	}
}

// TestLlamaServerPeer runs the tool against a real llama-server (named by
// PARLEY_BENCH_LLAMA_SERVER; scripts/build-llama-server.sh builds one; CI
// has none) on a synthetic embedding model and a synthetic reranker: its
// vectors and scores must equal the in-process engine's on the same inputs,
// and both must be measured.
func TestLlamaServerPeer(t *testing.T) {
	bin := os.Getenv("PARLEY_BENCH_LLAMA_SERVER")
	if bin == "" || testing.Short() {
		t.Skip("set PARLEY_BENCH_LLAMA_SERVER to a llama-server binary")
	}
	t.Setenv("TMPDIR", t.TempDir()) // llama-server's logs
	for _, pooling := range []string{"mean", "rank"} {
		t.Run(pooling, func(t *testing.T) {
			spec := synth.DefaultSpec()
			spec.VocabFrom, spec.Arch, spec.Pooling = testmodel.Path(t), "bert", pooling
			spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN, spec.Context = 2, 64, 4, 4, 128, 512
			spec.Std, spec.ResidStd, spec.Type = 0.2, 0.2, "f32"
			model := filepath.Join(t.TempDir(), "bert-"+pooling+".gguf")
			if _, err := synth.Write(context.Background(), model, spec); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			var out bytes.Buffer
			err := run(ctx, []string{"-model", model, "-threads", "1", "-llama-server", bin,
				"-n", "4", "-batch", "2", "-clients", "1", "-long-n", "1", "-long-batch", "1", "-time", "1m", "-rounds", "2"}, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "largest difference") || strings.Contains(out.String(), "NOT within") {
				t.Error("llama-server's outputs are not within the tolerance of Parley's")
			}
			for _, row := range []string{"short      parley", "short      llama-server", "512-token  parley", "512-token  llama-server", "parley/llama-server over 2 rounds"} {
				if !strings.Contains(out.String(), row) {
					t.Errorf("no %q row", row)
				}
			}
		})
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{2}, 2}, {[]float64{1, 2, 9}, 2}, {[]float64{1, 2, 4, 9}, 3}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
