package llm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
)

// TestGPUProbeChild runs the current engine's GPU probe for real: this test
// binary re-executed with the probe's variable set (TestMain serves it),
// the pinned libraries, stories260K. Without a GPU the one layer
// it asks for stays on the CPU, so a sound model passes; a model that does
// not load fails the probe with the child's own words, which is what the
// server logs before it falls back to the CPU. (On a GPU whose kernels the
// library cannot run, the child dies of ggml_abort instead: docs/notes/2026-11-27-gpu-h200.md.)
func TestGPUProbeChild(t *testing.T) {
	if os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") == "1" {
		t.Skip("PARLEY_SKIP_CURRENT_ENGINE=1")
	}
	t.Setenv(gpuProbeSkipEnv, "")
	lib := testLibDir()
	if err := probeCurrentGPU(lib, testmodel.Path(t), false); err != nil {
		t.Fatalf("a sound model failed the probe: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "damaged.gguf")
	if err := os.WriteFile(bad, []byte("GGUF\x03\x00\x00\x00 not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := probeCurrentGPU(lib, bad, false)
	if !errors.Is(err, errGPUProbe) || !strings.Contains(err.Error(), "gpu probe: the model did not load") {
		t.Fatalf("a damaged model: want the probe's failure with the child's words, got %v", err)
	}
	if err := probeCurrentGPU(t.TempDir(), testmodel.Path(t), false); err == nil || !strings.Contains(err.Error(), "libllama.so") {
		t.Fatalf("no libraries: want the child to name what is missing, got %v", err)
	}
}

// TestGPUProbeNeedsAServingExecutable: an executable that does not serve
// the probe (its main never calls ServeGPUProbe) fails it, and so does a
// probe child that tries to probe again: the model then runs on the CPU.
func TestGPUProbeNeedsAServingExecutable(t *testing.T) {
	t.Setenv(gpuProbeSkipEnv, "")
	err := runGPUProbe("/bin/true", t.TempDir(), "model.gguf", false)
	if !errors.Is(err, errGPUProbe) || !strings.Contains(err.Error(), "does not serve the probe") {
		t.Fatalf("an executable that exits 0 without serving: %v", err)
	}
	t.Setenv(gpuProbeEnv, "x")
	if !GPUProbeChild(os.Getenv) {
		t.Fatal("GPUProbeChild with the variable set: false")
	}
	if err := probeCurrentGPU(t.TempDir(), "model.gguf", false); !errors.Is(err, errGPUProbe) {
		t.Fatalf("a probe child probing again: %v", err)
	}
}
