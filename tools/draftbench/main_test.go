package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testmodel"
)

func TestLlamaModeArgs(t *testing.T) {
	c := &config{draftMax: 8}
	for _, m := range []struct {
		mode string
		want string // "" for no arguments
	}{
		{"off", ""},
		{"ngram-simple", "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8"},
		{"ngram-mod", "--spec-default"},
	} {
		args, err := llamaModeArgs(m.mode, c, 2)
		if err != nil || strings.Join(args, " ") != m.want {
			t.Errorf("%s: %q, %v; want %q", m.mode, args, err, m.want)
		}
	}
	if _, err := llamaModeArgs("draft", c, 2); err == nil {
		t.Error("draft without a draft model: want an error")
	}
	c.draftModel = "d.gguf"
	args, err := llamaModeArgs("draft", c, 2)
	if got := strings.Join(args, " "); err != nil || !strings.Contains(got, "--spec-draft-model d.gguf --spec-draft-n-max 8 --spec-draft-threads 2") {
		t.Errorf("draft: %q, %v", got, err)
	}
	if _, err := llamaModeArgs("lookup", c, 2); err == nil {
		t.Error("an unknown mode: want an error")
	}
}

// TestLlamaServerRows runs the tool against a real llama-server (named by
// PARLEY_BENCH_LLAMA_SERVER; scripts/build-llama-server.sh builds one; CI
// has none) on stories260K, one stream: each of its settings gets a row
// for each workload, its greedy replies are Parley's token for token (the
// same model and llama.cpp source, prompts sent as token ids), and its
// n-gram lookup drafts on the workload that repeats its prompt.
func TestLlamaServerRows(t *testing.T) {
	bin := os.Getenv("PARLEY_BENCH_LLAMA_SERVER")
	if bin == "" || testing.Short() {
		t.Skip("set PARLEY_BENCH_LLAMA_SERVER to a llama-server binary")
	}
	t.Setenv("TMPDIR", t.TempDir()) // llama-server's logs
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, []string{"-model", testmodel.Path(t), "-engine", "current", "-threads", "1", "-streams", "1",
		"-tokens", "24", "-modes", "off,ngram", "-llama-server", bin}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.Contains(line, "llama-server") {
			continue
		}
		rows++
		cells := strings.Split(line, "|")
		if len(cells) < 11 || strings.TrimSpace(cells[10]) != "yes" {
			t.Errorf("llama-server's tokens are not Parley's: %s", line)
		}
		if strings.Contains(line, "repeat | llama-server ngram-simple") && strings.TrimSpace(cells[7]) == "0.00" {
			t.Errorf("llama-server's lookup drafted nothing on the repeat workload: %s", line)
		}
	}
	if rows != 6 {
		t.Errorf("%d llama-server rows, want 6 (3 settings, 2 workloads)", rows)
	}
}
