// Package testmodel finds the tiny real model every test uses.
package testmodel

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Path returns the path of stories260K.gguf: $PARLEY_TEST_MODEL, or
// ../shared/models/stories260K.gguf beside the repository. It fails the test
// when the file is missing: every test that needs a model uses the real one.
func Path(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("PARLEY_TEST_MODEL"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	p, err := filepath.Abs(filepath.Join(root, "..", "shared", "models", "stories260K.gguf"))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("test model: %v (set PARLEY_TEST_MODEL)", err)
	}
	return p
}
