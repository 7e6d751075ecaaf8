package source_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm/source"
)

const modelMediaType = "application/vnd.ollama.image.model"

type layer struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// writeManifest writes an Ollama image manifest for host/ns/model/tag.
func writeManifest(t *testing.T, store, name string, layers ...layer) {
	t.Helper()
	m := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.docker.distribution.manifest.v2+json",
		"config":        layer{MediaType: "application/vnd.docker.container.image.v1+json", Digest: "sha256:" + strings.Repeat("c", 64), Size: 2},
		"layers":        layers,
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(store, "manifests", filepath.FromSlash(name)), data)
}

// newStore builds a store the way Ollama lays it out: the model blob named
// by its sha256, and manifests naming it under several names.
func newStore(t *testing.T) (store, blob string, size int64) {
	t.Helper()
	body, sum := model(t)
	store = t.TempDir()
	blob = writeFile(t, filepath.Join(store, "blobs", "sha256-"+sum), body)
	size = int64(len(body))
	model := layer{MediaType: modelMediaType, Digest: "sha256:" + sum, Size: size}
	tmpl := layer{MediaType: "application/vnd.ollama.image.template", Digest: "sha256:" + strings.Repeat("d", 64), Size: 10}
	writeManifest(t, store, "registry.ollama.ai/library/stories/latest", tmpl, model)
	writeManifest(t, store, "registry.ollama.ai/library/stories/q8", model)
	writeManifest(t, store, "registry.ollama.ai/me/tiny/v2", model)
	writeManifest(t, store, "localhost:5000/team/tiny/latest", model)
	writeManifest(t, store, "registry.ollama.ai/library/Mixed/latest", model)
	// A model with no GGUF layer (e.g. safetensors-based), a blob that is
	// missing, a blob that is not GGUF, and a manifest that is not JSON.
	writeManifest(t, store, "registry.ollama.ai/library/tensors/latest",
		layer{MediaType: "application/vnd.ollama.image.tensor", Digest: "sha256:" + strings.Repeat("e", 64), Size: 1})
	writeManifest(t, store, "registry.ollama.ai/library/gone/latest",
		layer{MediaType: modelMediaType, Digest: "sha256:" + strings.Repeat("f", 64), Size: 1})
	writeFile(t, filepath.Join(store, "blobs", "sha256-"+strings.Repeat("a", 64)), []byte("not a model"))
	writeManifest(t, store, "registry.ollama.ai/library/junk/latest",
		layer{MediaType: modelMediaType, Digest: "sha256:" + strings.Repeat("a", 64), Size: 11})
	writeManifest(t, store, "registry.ollama.ai/library/short/latest",
		layer{MediaType: modelMediaType, Digest: "sha256:" + sum, Size: size + 1})
	writeFile(t, filepath.Join(store, "manifests", "registry.ollama.ai", "library", "broken", "latest"), []byte("{"))
	return store, blob, size
}

func TestResolveOllama(t *testing.T) {
	_, sum := model(t)
	store, blob, _ := newStore(t)
	tests := []struct {
		name    string
		ref     string
		opts    []source.Option
		wantErr error
		wantMsg string
	}{
		{name: "name", ref: "ollama://stories"},
		{name: "name and tag", ref: "ollama://stories:latest"},
		{name: "other tag", ref: "ollama://stories:q8"},
		{name: "namespace", ref: "ollama://library/stories"},
		{name: "fully qualified", ref: "ollama://registry.ollama.ai/library/stories:latest"},
		{name: "user namespace", ref: "ollama://me/tiny:v2"},
		{name: "host with port", ref: "ollama://localhost:5000/team/tiny"},
		{name: "case-insensitive", ref: "ollama://STORIES:Latest"},
		{name: "stored with capitals", ref: "ollama://mixed"},
		{name: "checksum ok", ref: "ollama://stories", opts: []source.Option{source.WithSHA256(sum)}},
		{name: "checksum mismatch", ref: "ollama://stories", opts: []source.Option{source.WithSHA256(strings.Repeat("0", 64))},
			wantErr: source.ErrChecksum},
		{name: "unknown model suggests tags", ref: "ollama://storie", wantErr: source.ErrNotFound,
			wantMsg: "similar: stories:latest, stories:q8"},
		{name: "unknown tag suggests tags", ref: "ollama://stories:f16", wantErr: source.ErrNotFound,
			wantMsg: "similar: stories:latest, stories:q8"},
		{name: "unknown model lists store", ref: "ollama://qwen3", wantErr: source.ErrNotFound, wantMsg: "the store has: "},
		{name: "no model layer", ref: "ollama://tensors", wantErr: source.ErrNoModelLayer, wantMsg: "application/vnd.ollama.image.tensor"},
		{name: "blob missing", ref: "ollama://gone", wantErr: source.ErrNotFound, wantMsg: "pull the model again"},
		{name: "blob not gguf", ref: "ollama://junk", wantErr: source.ErrNotGGUF},
		{name: "blob size differs", ref: "ollama://short", wantMsg: "manifest says"},
		{name: "manifest not json", ref: "ollama://broken", wantMsg: "manifest"},
		{name: "bad name", ref: "ollama://a/b/c/d", wantErr: source.ErrInvalidRef},
		{name: "dot-dot", ref: "ollama://../stories", wantErr: source.ErrInvalidRef},
		{name: "empty tag", ref: "ollama://stories:", wantErr: source.ErrInvalidRef},
		{name: "empty", ref: "ollama://", wantErr: source.ErrInvalidRef},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]source.Option{source.WithGetenv(noEnv), source.WithOllamaDir(store)}, tt.opts...)
			got, err := source.Resolve(context.Background(), tt.ref, opts...)
			if tt.wantErr == nil && tt.wantMsg == "" {
				if err != nil || got != blob {
					t.Fatalf("Resolve(%q) = %q, %v; want %q", tt.ref, got, err, blob)
				}
				return
			}
			t.Logf("error: %v", err)
			if err == nil {
				t.Fatalf("Resolve(%q) = %q, want an error", tt.ref, got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Resolve(%q) error = %v, want %v", tt.ref, err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

// The store comes from the option, else OLLAMA_MODELS, else ~/.ollama/models.
func TestResolveOllamaStore(t *testing.T) {
	store, blob, _ := newStore(t)
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".ollama"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(store, filepath.Join(home, ".ollama", "models")); err != nil {
		t.Fatal(err)
	}
	homeBlob := filepath.Join(home, ".ollama", "models", "blobs", filepath.Base(blob))
	tests := []struct {
		name    string
		opts    []source.Option
		want    string
		wantErr error
	}{
		{name: "env", opts: []source.Option{source.WithGetenv(envOf(map[string]string{"OLLAMA_MODELS": store, "HOME": t.TempDir()}))}, want: blob},
		{name: "home", opts: []source.Option{source.WithGetenv(envOf(map[string]string{"HOME": home}))}, want: homeBlob},
		{name: "option beats env", opts: []source.Option{
			source.WithGetenv(envOf(map[string]string{"OLLAMA_MODELS": t.TempDir()})), source.WithOllamaDir(store)}, want: blob},
		{name: "store missing", opts: []source.Option{source.WithGetenv(noEnv), source.WithOllamaDir(filepath.Join(home, "nope"))},
			wantErr: source.ErrNotFound},
		{name: "no home", opts: []source.Option{source.WithGetenv(noEnv)}, wantErr: source.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := source.Resolve(context.Background(), "ollama://stories", tt.opts...)
			if tt.wantErr != nil {
				t.Logf("error: %v", err)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Resolve = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// ollamaBin returns a real ollama binary: env PARLEY_OLLAMA_BIN, else the
// one scripts/build-ollama.sh builds by default.
func ollamaBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PARLEY_OLLAMA_BIN"); p != "" {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "parley", "ollama", "ollama")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no ollama binary: set PARLEY_OLLAMA_BIN or run scripts/build-ollama.sh")
	return ""
}

// A real store, made by `ollama create` from the test model, resolves to the
// blob Ollama wrote, byte for byte the model, without a copy by us.
func TestResolveOllamaReal(t *testing.T) {
	bin := ollamaBin(t)
	_, sum := model(t)
	modelFile := testmodel.Path(t)
	tmp := t.TempDir()
	store := filepath.Join(tmp, "models")
	addr, err := proc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"OLLAMA_HOST="+addr,
		"OLLAMA_MODELS="+store,
		"HOME="+tmp, // Ollama writes its key pair under $HOME/.ollama
		"OLLAMA_NOPRUNE=1",
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	serve := exec.CommandContext(ctx, bin, "serve")
	serve.Env = env
	serve.Cancel = func() error { return serve.Process.Signal(syscall.SIGTERM) }
	serve.WaitDelay = 10 * time.Second // then SIGKILL
	var serveLog proc.Buffer           // written by exec's copying goroutine while we may read it
	serve.Stdout, serve.Stderr = &serveLog, &serveLog
	p, err := proc.Start(serve)
	if err != nil {
		t.Fatalf("start ollama serve: %v", err)
	}
	stop := func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		<-p.Done()
	}
	defer stop()

	if err := p.WaitHTTP(ctx, "http://"+addr+"/api/version"); err != nil {
		t.Fatalf("ollama serve did not come up: %v\n%s", err, serveLog.String())
	}

	modelfile := writeFile(t, filepath.Join(tmp, "Modelfile"), []byte(fmt.Sprintf("FROM %s\n", modelFile)))
	create := exec.CommandContext(ctx, bin, "create", "parley-test:tiny", "-f", modelfile)
	create.Env = env
	out, err := create.CombinedOutput()
	if err != nil {
		t.Fatalf("ollama create: %v\n%s\nserver log:\n%s", err, out, serveLog.String())
	}
	t.Logf("ollama create: %s", bytes.TrimSpace(out))
	// The store is read from disk: the server is not needed any more, and
	// stopping it first proves Resolve does not talk to it.
	stop()

	for _, ref := range []string{"ollama://parley-test:tiny", "ollama://library/parley-test:tiny", "ollama://registry.ollama.ai/library/parley-test:tiny"} {
		got, err := source.Resolve(context.Background(), ref, source.WithGetenv(noEnv), source.WithOllamaDir(store), source.WithSHA256(sum))
		if err != nil {
			t.Fatalf("Resolve(%q) = %v", ref, err)
		}
		if want := filepath.Join(store, "blobs", "sha256-"+sum); got != want {
			t.Fatalf("Resolve(%q) = %q, want %q", ref, got, want)
		}
	}
	_, err = source.Resolve(context.Background(), "ollama://parley-test", source.WithGetenv(noEnv), source.WithOllamaDir(store))
	if !errors.Is(err, source.ErrNotFound) || !strings.Contains(err.Error(), "parley-test:tiny") {
		t.Fatalf("Resolve of the untagged name = %v, want not found suggesting parley-test:tiny", err)
	}
}
