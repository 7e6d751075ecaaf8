package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// TestLoadSmall runs the load test end to end at a small scale against the
// real binary: sessions open, some generate, probes past the cap are
// refused, every session verifies, the server exits 0, and the section is
// written into a markdown file without disturbing what else is in it.
func TestLoadSmall(t *testing.T) {
	args := []string{"-bin", testbin.Parley(t), "-model", testmodel.Path(t),
		"-conns", "24", "-active", "3", "-duration", "2s", "-probes", "2", "-threads", "1", "-max-tokens", "16"}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	os.WriteFile(out, []byte("# Benchmarks\n\n## Engine\n\nkept as it is\n"), 0o644)
	var stdout bytes.Buffer
	err := run(context.Background(), append(args, "-out", out), &stdout)
	t.Log(stdout.String())
	if err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(out)
	for _, want := range []string{"## Engine\n\nkept as it is", beginMarker, "## Load (tools/load)", "RSS per idle connection",
		"| connections past the cap refused (503) | 2 of 2 |", "| sessions intact afterwards (history = turns seen) | 24 of 24 |",
		"| unexpected errors | 0 |", "| exit status after SIGTERM | 0 |", endMarker} {
		if !strings.Contains(string(md), want) {
			t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
		}
	}
	// A second run replaces the section instead of adding another.
	if err := run(context.Background(), append(args, "-out", out, "-duration", "1s"), &stdout); err != nil {
		t.Fatal(err)
	}
	md, _ = os.ReadFile(out)
	if strings.Count(string(md), beginMarker) != 1 || !strings.Contains(string(md), "kept as it is") {
		t.Fatalf("second run:\n%s", md)
	}
}
