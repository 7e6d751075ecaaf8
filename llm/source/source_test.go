package source_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm/source"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// model returns the test model's bytes and their sha256 in hex.
func model(t testing.TB) ([]byte, string) {
	t.Helper()
	b, err := os.ReadFile(testmodel.Path(t))
	if err != nil {
		t.Fatalf("read test model: %v", err)
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// noEnv is a getenv that sees an empty environment, so tests are hermetic.
func noEnv(string) string { return "" }

// envOf is a getenv over a fixed map.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeFile(t testing.TB, path string, data []byte) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestResolveFile(t *testing.T) {
	body, sum := model(t)
	dir := t.TempDir()
	good := writeFile(t, filepath.Join(dir, "good.gguf"), body)
	text := writeFile(t, filepath.Join(dir, "notes.gguf"), []byte("<html>not a model</html>"))
	short := writeFile(t, filepath.Join(dir, "short.gguf"), []byte("GG"))
	empty := writeFile(t, filepath.Join(dir, "empty.gguf"), nil)
	bad := strings.Repeat("0", 64)

	tests := []struct {
		name    string
		ref     string
		opts    []source.Option
		wantErr error  // nil: success, path == ref
		wantMsg string // substring of the error message
	}{
		{name: "good", ref: good},
		{name: "good with sha256", ref: good, opts: []source.Option{source.WithSHA256(sum)}},
		{name: "upper-case sha256", ref: good, opts: []source.Option{source.WithSHA256(strings.ToUpper(sum))}},
		{name: "sha256 mismatch", ref: good, opts: []source.Option{source.WithSHA256(bad)}, wantErr: source.ErrChecksum, wantMsg: "want " + bad},
		{name: "bad sha256 option", ref: good, opts: []source.Option{source.WithSHA256("abc")}, wantErr: source.ErrInvalidRef},
		{name: "missing", ref: filepath.Join(dir, "nope.gguf"), wantErr: source.ErrNotFound, wantMsg: "no such file"},
		{name: "directory", ref: dir, wantErr: source.ErrNotGGUF, wantMsg: "is a directory"},
		{name: "text file", ref: text, wantErr: source.ErrNotGGUF, wantMsg: `starts with "<htm"`},
		{name: "short file", ref: short, wantErr: source.ErrNotGGUF, wantMsg: "only 2 bytes"},
		{name: "empty file", ref: empty, wantErr: source.ErrNotGGUF, wantMsg: "only 0 bytes"},
		{name: "empty ref", ref: "", wantErr: source.ErrInvalidRef},
		{name: "unknown scheme", ref: "s3://bucket/model.gguf", wantErr: source.ErrInvalidRef, wantMsg: `unsupported scheme "s3"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]source.Option{source.WithGetenv(noEnv)}, tt.opts...)
			got, err := source.Resolve(context.Background(), tt.ref, opts...)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Resolve(%q) = %v", tt.ref, err)
				}
				if got != tt.ref {
					t.Fatalf("Resolve(%q) = %q, want the path itself", tt.ref, got)
				}
				return
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Resolve(%q) error = %v, want %v", tt.ref, err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
	// A checksum failure on a user's own file must never delete it.
	if got, err := os.ReadFile(good); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("local model file changed or removed: %v", err)
	}
}

func TestResolveFilePermission(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("running as root: file permissions do not apply")
	}
	body, _ := model(t)
	p := writeFile(t, filepath.Join(t.TempDir(), "locked.gguf"), body)
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	_, err := source.Resolve(context.Background(), p, source.WithGetenv(noEnv))
	if !errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("error = %v, want permission denied", err)
	}
}
