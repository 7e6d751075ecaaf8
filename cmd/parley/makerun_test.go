package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// make run's model: the test copy beside the repository when it
// is there, else stories260K through Parley's own hf:// source, pinned by
// the Makefile's MODEL_SHA256. No hub is reachable from the test machines,
// so the download runs against a loopback stand-in for Hugging Face
// (HF_ENDPOINT) that serves the test copy: it shows the fallback's
// reference, pin and download path work, not that the hub serves the same
// bytes today.

const modelHF = "hf://ggml-org/models/tinyllamas/stories260K.gguf"

// makefilePin reads MODEL_SHA256 from the Makefile.
func makefilePin(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^MODEL_SHA256 := ([0-9a-f]{64})$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Makefile pins no MODEL_SHA256")
	}
	return string(m[1])
}

// TestMakeRunPicksItsModel: make run serves SHARED_MODEL when it exists and
// the pinned hf:// reference when not, and installs nothing of the test
// tooling (npm's SDKs, chromium, redis, nginx).
func TestMakeRunPicksItsModel(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	dryRun := func(shared string) string {
		out, err := exec.Command("make", "-n", "-C", "../..", "run", "SHARED_MODEL="+shared).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n run: %v\n%s", err, out)
		}
		return string(out)
	}
	pin := makefilePin(t)
	present := testmodel.Path(t)
	out := dryRun(present)
	if !strings.Contains(out, `--model "`+present+`"`) || strings.Contains(out, "--model-sha256") {
		t.Errorf("with %s present make run does:\n%s", present, out)
	}
	out = dryRun(filepath.Join(t.TempDir(), "absent.gguf"))
	if !strings.Contains(out, `--model "`+modelHF+`" --model-sha256 `+pin) {
		t.Errorf("without the test copy make run does:\n%s", out)
	}
	for _, tooling := range []string{"chromium", "redis-server", "nginx", "cd scripts && npm ci"} {
		if strings.Contains(out, tooling) {
			t.Errorf("make run installs test tooling (%s):\n%s", tooling, out)
		}
	}
}

// TestModelFallbackDownloadsThePinnedFile: the fallback reference, with the
// Makefile's pin, downloads from the hub (a stand-in here) and serves.
func TestModelFallbackDownloadsThePinnedFile(t *testing.T) {
	bin := testbin.Parley(t)
	model := testmodel.Path(t)
	var hits atomic.Int32
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		f, err := os.Open(model)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		http.ServeContent(w, r, "stories260K.gguf", time.Time{}, f)
	}))
	defer hub.Close()
	t.Setenv("HF_ENDPOINT", hub.URL)
	s := launch(t, bin, "--model", modelHF, "--model-sha256", makefilePin(t), "--store", "memory")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.WaitHTTP(ctx, "http://"+s.addr+"/ready"); err != nil {
		t.Fatalf("not ready: %v\n%s", err, s.log())
	}
	if hits.Load() == 0 || !strings.Contains(s.log(), `"msg":"model loaded"`) {
		t.Fatalf("hub requests %d; log:\n%s", hits.Load(), s.log())
	}
}

// TestMakeRunRebuildsNothingUnchanged: make run's setup steps are stamped:
// with the current engine's package installed and its CPU backend built
// after their inputs last changed, make run neither installs the package
// again nor reruns the CMake build; with the stamps older than their
// inputs, it does both. (Go's own cache makes the go build a no-op.)
func TestMakeRunRebuildsNothingUnchanged(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	dir := t.TempDir()
	engine, cpu := filepath.Join(dir, "engine-stamp"), filepath.Join(dir, "cpu-stamp")
	dryRun := func() string {
		out, err := exec.Command("make", "-n", "-C", "../..", "run", "SHARED_MODEL="+testmodel.Path(t),
			"ENGINE_STAMP="+engine, "ENGINE_CPU_STAMP="+cpu).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n run: %v\n%s", err, out)
		}
		return string(out)
	}
	for _, f := range []string{engine, cpu} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The stamps are newer than every input (the files of this checkout).
	later := time.Now().Add(time.Hour)
	os.Chtimes(engine, later, later)
	os.Chtimes(cpu, later.Add(time.Minute), later.Add(time.Minute))
	rebuilds := []string{"npm ci", "build-current-backend.sh"}
	out := dryRun()
	for _, step := range rebuilds {
		if strings.Contains(out, step) {
			t.Errorf("make run with nothing changed runs %s:\n%s", step, out)
		}
	}
	old := time.Unix(0, 0)
	os.Chtimes(engine, old, old)
	os.Chtimes(cpu, old, old)
	out = dryRun()
	for _, step := range rebuilds {
		if !strings.Contains(out, step) {
			t.Errorf("make run with the engine's package changed does not run %s:\n%s", step, out)
		}
	}
}
