package benchmd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/tools/internal/benchmd"
)

func TestWriteSection(t *testing.T) {
	m := benchmd.Markers{Begin: "<!-- tool: generated -->", End: "<!-- /tool -->"}
	other := "<!-- other: generated -->\n\nits table\n\n<!-- /other -->\n"
	section := "## Results\n\n| a | b |\n"
	block := m.Begin + "\n\n" + strings.TrimSpace(section) + "\n\n" + m.End + "\n"
	tests := []struct {
		name, old, want string
		exists          bool
	}{
		{name: "new file", want: "# Benchmarks\n\n" + block},
		{name: "replaces its section and keeps the rest", exists: true,
			old:  "# Benchmarks\n\nintro\n\n" + m.Begin + "\nold table\n" + m.End + "\n\n## Load test\n\nfigures\n",
			want: "# Benchmarks\n\nintro\n\n" + block + "\n## Load test\n\nfigures\n"},
		{name: "appends to a file without markers", exists: true,
			old:  "# Benchmarks\n\n## Load test\n",
			want: "# Benchmarks\n\n## Load test\n\n" + block},
		{name: "leaves another tool's section alone", exists: true,
			old:  "# Benchmarks\n\n" + other + "\n" + m.Begin + "\nold\n" + m.End + "\n",
			want: "# Benchmarks\n\n" + other + "\n" + block},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
			if tt.exists {
				if err := os.WriteFile(path, []byte(tt.old), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := benchmd.WriteSection(path, m, section); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != tt.want {
				t.Errorf("got\n%q\nwant\n%q", got, tt.want)
			}
			// Idempotent: a second write changes nothing.
			if err := benchmd.WriteSection(path, m, section); err != nil {
				t.Fatal(err)
			}
			again, _ := os.ReadFile(path)
			if !bytes.Equal(got, again) {
				t.Errorf("second write changed the file:\n%s", again)
			}
		})
	}
}

func TestWriteSectionUnreadable(t *testing.T) {
	// A directory where the file should be: reading fails, and the error says where.
	dir := t.TempDir()
	err := benchmd.WriteSection(dir, benchmd.Markers{Begin: "<!-- a -->", End: "<!-- /a -->"}, "x")
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("WriteSection on a directory: %v", err)
	}
}
