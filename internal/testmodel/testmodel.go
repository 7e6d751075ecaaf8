// Package testmodel finds the tiny real model every test uses.
package testmodel

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/parley-chat/parley/internal/repo"
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
