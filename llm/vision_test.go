package llm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/llm"
)

func TestFindProjector(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "model-Q4_K_M.gguf")
	touch := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	touch("model-Q4_K_M.gguf")
	touch("mmproj-notes.txt")
	if p, err := llm.FindProjector(model); p != "" || err != nil {
		t.Errorf("no projector: %q, %v", p, err)
	}
	touch("mmproj-model-f16.gguf")
	if p, err := llm.FindProjector(model); p != filepath.Join(dir, "mmproj-model-f16.gguf") || err != nil {
		t.Errorf("one projector: %q, %v", p, err)
	}
	touch("MMPROJ-model-Q8_0.GGUF")
	if _, err := llm.FindProjector(model); err == nil || !strings.Contains(err.Error(), "several projectors") {
		t.Errorf("two projectors: %v", err)
	}
}
