package llm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAutoPrefersEmbedded: auto keeps F16 weights off the current engine
// only where its folder holds the prebuilt CPU variants (no libggml-cpu.so,
// which scripts/build-current-backend.sh compiles).
func TestAutoPrefersEmbedded(t *testing.T) {
	prebuilt, built := t.TempDir(), t.TempDir()
	for dir, names := range map[string][]string{
		prebuilt: {"libggml-base.so", "libggml-cpu-haswell.so", "libggml-cpu-zen4.so"},
		built:    {"libggml-base.so", "libggml-cpu.so"},
	} {
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		quant, dir string
		want       bool
	}{
		{"F16", prebuilt, true},
		{"f16", prebuilt, true},
		{"F16", built, false},
		{"Q8_0", prebuilt, false},
		{"Q4_0", built, false},
	} {
		var m metadata
		m.info.Quantization = c.quant
		if got := autoPrefersEmbedded(m, c.dir); got != c.want {
			t.Errorf("%s with %s: %v, want %v", c.quant, filepath.Base(c.dir), got, c.want)
		}
	}
}
