// Package testbin gives tests the parley binary under test.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/parley-chat/parley/internal/repo"
)

// Parley returns the parley binary: $PARLEY_BIN when set (scripts/test.sh
// sets it to a fresh bin/parley), else one built from cmd/parley into a
// temporary directory, with the cgo flags of scripts/env.sh where the
// environment has none, so the build cache is reused. In -short mode it
// skips the test rather than build.
func Parley(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("PARLEY_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("PARLEY_BIN: %v", err)
		}
		return p
	}
	if testing.Short() {
		tb.Skip("builds the binary; set PARLEY_BIN to use a built one")
	}
	_, file, _, _ := runtime.Caller(0)
	root, ok := repo.Root(filepath.Dir(file))
	if !ok {
		tb.Fatalf("no go.mod above %s", file)
	}
	out := filepath.Join(tb.TempDir(), "parley")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/parley")
	cmd.Dir = root
	march := os.Getenv("PARLEY_MARCH")
	if march == "" {
		march = "x86-64-v3"
	}
	cmd.Env = os.Environ()
	for k, v := range map[string]string{
		"CGO_ENABLED":  "1",
		"CGO_CPPFLAGS": "-I" + filepath.Join(root, "llm", "native"),
		"CGO_CFLAGS":   "-O3 -march=" + march,
		"CGO_CXXFLAGS": "-O3 -march=" + march,
	} {
		if os.Getenv(k) == "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/parley: %v\n%s", err, b)
	}
	return out
}
