package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/internal/testmodel"
)

// TestOllamaShapesMatchOllama sends the same requests to a real Ollama
// (the binary scripts/build-ollama.sh builds, of the release whose llama.cpp
// binding Parley links), serving the same GGUF, and to Parley, and checks
// that every field Ollama's answer has, Parley's has too, with a value of
// the same JSON kind: a client written against Ollama finds what it reads.
// Skipped without the binary (env PARLEY_OLLAMA_BIN, or the default place).
func TestOllamaShapesMatchOllama(t *testing.T) {
	bin := ollamaPeerBin(t)
	peer := startOllamaPeer(t, bin)
	s := mustOpenAPI(t, nil)
	opts := map[string]any{"temperature": 0, "num_predict": 8}
	msgs := []map[string]any{{"role": "user", "content": "Tell me a story."}}
	requests := []struct {
		method, path string
		body         map[string]any
	}{
		{http.MethodGet, "/api/version", nil},
		{http.MethodGet, "/api/tags", nil},
		{http.MethodPost, "/api/show", map[string]any{"model": "MODEL"}},
		{http.MethodPost, "/api/chat", map[string]any{"model": "MODEL", "messages": msgs, "stream": false, "options": opts}},
		{http.MethodPost, "/api/chat", map[string]any{"model": "MODEL", "messages": msgs, "options": opts}},
		{http.MethodPost, "/api/generate", map[string]any{"model": "MODEL", "prompt": "Once upon a time", "stream": false, "options": opts}},
		{http.MethodPost, "/api/generate", map[string]any{"model": "MODEL", "prompt": "Once upon a time", "options": opts}},
		{http.MethodGet, "/api/ps", nil},
		{http.MethodPost, "/api/show", map[string]any{"model": "no-such-model"}},
		{http.MethodPost, "/api/chat", map[string]any{"model": "MODEL", "messages": "hi"}},
	}
	for _, r := range requests {
		name := r.method + " " + r.path
		if r.body != nil && r.body["stream"] == nil && r.path != "/api/show" {
			name += " (streamed)"
		}
		want, wantStatus := ollamaObjects(t, peer, r.method, r.path, r.body, "parley-peer:latest")
		got, gotStatus := ollamaObjects(t, s.base, r.method, r.path, r.body, "llama:latest")
		if wantStatus != gotStatus {
			t.Errorf("%s: status %d, Ollama's %d", name, gotStatus, wantStatus)
		}
		if r.path == "/api/show" && wantStatus == http.StatusOK {
			// The same GGUF has the same capabilities on both.
			wc, gc := want[0].(map[string]any)["capabilities"], got[0].(map[string]any)["capabilities"]
			if fmt.Sprint(wc) != fmt.Sprint(gc) {
				t.Errorf("capabilities %v, Ollama's %v", gc, wc)
			}
		}
		// Compare the first and the last object of a stream (or the one object).
		for _, pair := range [][2]int{{0, 0}, {len(want) - 1, len(got) - 1}} {
			for _, miss := range missingFields("", want[pair[0]], got[pair[1]]) {
				t.Errorf("%s: Ollama's answer has %s, Parley's does not", name, miss)
			}
		}
	}
}

// missingFields lists the paths of want's object fields that got lacks or
// holds as another JSON kind (arrays are compared by their first element).
func missingFields(path string, want, got any) []string {
	var out []string
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{path + " (an object)"}
		}
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if strings.Contains(k, ".") && path == ".model_info" {
				continue // model_info's keys are the GGUF's: which ones a model has is its own
			}
			gv, ok := g[k]
			if !ok {
				out = append(out, path+"."+k)
				continue
			}
			out = append(out, missingFields(path+"."+k, w[k], gv)...)
		}
	case []any:
		g, ok := got.([]any)
		if !ok {
			return []string{path + " (an array)"}
		}
		if len(w) > 0 && len(g) > 0 {
			out = append(out, missingFields(path+"[0]", w[0], g[0])...)
		}
	case nil:
	default:
		if fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) && got != nil {
			out = append(out, fmt.Sprintf("%s (%T, got %T)", path, want, got))
		}
	}
	return out
}

// ollamaObjects sends one request (MODEL in the body replaced by model) and
// returns the JSON objects of its answer: one, or one per NDJSON line.
func ollamaObjects(tb testing.TB, base, method, path string, body map[string]any, model string) ([]any, int) {
	tb.Helper()
	var rd io.Reader
	if body != nil {
		b := map[string]any{}
		for k, v := range body {
			if v == "MODEL" {
				v = model
			}
			b[k] = v
		}
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, base+path, rd)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s%s: %v", method, base, path, err)
	}
	defer res.Body.Close()
	var objs []any
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var v any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			tb.Fatalf("%s %s%s: line %q: %v", method, base, path, sc.Text(), err)
		}
		objs = append(objs, v)
	}
	if len(objs) == 0 {
		tb.Fatalf("%s %s%s: status %d, no JSON", method, base, path, res.StatusCode)
	}
	return objs, res.StatusCode
}

func ollamaPeerBin(t *testing.T) string {
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

// startOllamaPeer runs `ollama serve` on a free port with a fresh store
// holding the test model as parley-peer:latest; the test's cleanup stops it.
func startOllamaPeer(t *testing.T, bin string) string {
	t.Helper()
	tmp := t.TempDir()
	addr, err := proc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "OLLAMA_HOST="+addr, "OLLAMA_MODELS="+filepath.Join(tmp, "models"), "HOME="+tmp, "OLLAMA_NOPRUNE=1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	serve := exec.CommandContext(ctx, bin, "serve")
	serve.Env = env
	serve.Cancel = func() error { return serve.Process.Signal(syscall.SIGTERM) }
	serve.WaitDelay = 10 * time.Second
	var log proc.Buffer
	serve.Stdout, serve.Stderr = &log, &log
	p, err := proc.Start(serve)
	if err != nil {
		cancel()
		t.Fatalf("start ollama serve: %v", err)
	}
	t.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		<-p.Done()
		cancel()
	})
	if err := p.WaitHTTP(ctx, "http://"+addr+"/api/version"); err != nil {
		t.Fatalf("ollama serve did not come up: %v\n%s", err, log.String())
	}
	modelfile := filepath.Join(tmp, "Modelfile")
	if err := os.WriteFile(modelfile, []byte("FROM "+testmodel.Path(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	create := exec.CommandContext(ctx, bin, "create", "parley-peer:latest", "-f", modelfile)
	create.Env = env
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("ollama create: %v\n%s\n%s", err, out, log.String())
	}
	return "http://" + addr
}
