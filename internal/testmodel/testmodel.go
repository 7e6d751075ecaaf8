// Package testmodel finds the tiny real model every test uses.
package testmodel

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/internal/synth"
)

// Path returns the path of stories260K.gguf: $PARLEY_TEST_MODEL, or
// ../shared/models/stories260K.gguf beside the repository. It fails the test
// when the file is missing: every test that needs a model uses the real one.
func Path(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(repo.ModelEnv); p != "" {
		return p
	}
	// The repository is found from this file, so the answer does not depend
	// on the test's working directory.
	_, file, _, _ := runtime.Caller(0)
	root, ok := repo.Root(filepath.Dir(file))
	if !ok {
		tb.Fatalf("test model: no go.mod above %s (set %s)", file, repo.ModelEnv)
	}
	p, err := filepath.Abs(repo.TestModel(root))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("test model: %v (set %s)", err, repo.ModelEnv)
	}
	return p
}

// Scripted writes a small synthetic model (stories260K's vocabulary, 3 layers, dim 128) whose greedy reply to any
// prompt ending in script.After is script.Reply (see synth.Script), into the test's temporary folder, and returns
// its path. Writing takes well under a second.
func Scripted(tb testing.TB, script *synth.Script) string {
	tb.Helper()
	spec := synth.DefaultSpec()
	spec.VocabFrom = Path(tb)
	spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN, spec.Context = 3, 128, 4, 2, 256, 2048
	spec.Script = script
	out := filepath.Join(tb.TempDir(), "scripted.gguf")
	if _, err := synth.Write(context.Background(), out, spec); err != nil {
		tb.Fatalf("scripted model: %v", err)
	}
	return out
}
