// Package repo locates the repository and what the project keeps beside it
// (the shared test model), for the tests and the tools in tools/ beside the
// server (bench, load, mkgguf). It is never needed by the server itself.
package repo

import (
	"os"
	"path/filepath"
)

// ModelEnv is the environment variable that points the tests (and the
// tools' defaults that follow them) at a GGUF other than the shared test model.
const ModelEnv = "PARLEY_TEST_MODEL"

// Root returns the nearest directory at or above dir that holds go.mod, and
// false when there is none.
func Root(dir string) (string, bool) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, true
		}
		if filepath.Dir(d) == d {
			return "", false
		}
	}
}

// WorkingRoot is the Root above the working directory, else the working
// directory itself ("." when even that is unknown): the base of the tools'
// default paths (bin/parley, BENCHMARKS.md, the test model).
func WorkingRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	if root, ok := Root(wd); ok {
		return root
	}
	return wd
}

// TestModel is where the shared tiny test model lies for the repository at
// root: ../shared/models/stories260K.gguf beside it.
func TestModel(root string) string {
	return filepath.Join(root, "..", "shared", "models", "stories260K.gguf")
}
