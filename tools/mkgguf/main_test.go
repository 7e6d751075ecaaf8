package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/internal/testmodel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunKeepsMatchingFile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sub", "m.gguf")
	args := []string{"-o", out, "-vocab", testmodel.Path(t), "-layers", "2", "-dim", "64", "-heads", "4", "-kv-heads", "2", "-ffn", "128"}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if strings.TrimSpace(stdout.String()) != out {
		t.Errorf("stdout %q, want the output path", stdout.String())
	}
	first, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}

	stderr.Reset()
	if err := run(context.Background(), args, io.Discard, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "keeping it") {
		t.Errorf("second run did not keep the file: %s", stderr.String())
	}
	again, _ := os.Stat(out)
	if !again.ModTime().Equal(first.ModTime()) {
		t.Error("second run rewrote the file")
	}

	// Another seed is another model: rewritten.
	stderr.Reset()
	if err := run(context.Background(), append(args, "-seed", "7"), io.Discard, &stderr); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), "keeping it") {
		t.Error("a different seed kept the old file")
	}

	if err := run(context.Background(), append(args, "-heads", "5"), io.Discard, io.Discard); err == nil {
		t.Error("an invalid shape was accepted")
	}
}
