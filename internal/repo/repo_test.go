package repo_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/repo"
)

func TestRoot(t *testing.T) {
	top := t.TempDir()
	mod := filepath.Join(top, "mod")
	deep := filepath.Join(mod, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, dir, want string
		ok              bool
	}{
		{"the root itself", mod, mod, true},
		{"below the root", deep, mod, true},
		{"above any go.mod", top, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := repo.Root(tt.dir)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("Root(%s) = %q, %v; want %q, %v", tt.dir, got, ok, tt.want, tt.ok)
			}
		})
	}
	if got, want := repo.TestModel(mod), filepath.Join(top, "shared", "models", "stories260K.gguf"); got != want {
		t.Fatalf("TestModel = %s, want %s", got, want)
	}
}

// The tools' base: this package's tests run in internal/repo, so the
// working root is the repository's, the folder with this module's go.mod.
func TestWorkingRoot(t *testing.T) {
	root := repo.WorkingRoot()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.HasPrefix(string(b), "module github.com/parley-chat/parley\n") {
		t.Fatalf("WorkingRoot = %s: go.mod %q, %v", root, b, err)
	}
}
