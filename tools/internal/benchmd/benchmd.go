// Package benchmd writes the generated sections of BENCHMARKS.md. Each tool
// (tools/bench, tools/load) owns one section between its own pair of
// markers and rewrites only that; the rest of the file is left as it is.
package benchmd

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Markers delimit one tool's section. They are HTML comments, so the
// rendered markdown does not show them; Begin must not occur inside End's
// text or the section.
type Markers struct{ Begin, End string }

// WriteSection puts section between m's markers in path: it replaces what
// the markers held when the file has them, else appends the markers and the
// section; a missing file is created with a "# Benchmarks" title. Writing the
// same section twice leaves the file as the first write made it.
func WriteSection(path string, m Markers, section string) error {
	block := m.Begin + "\n\n" + strings.TrimSpace(section) + "\n\n" + m.End + "\n"
	old, err := os.ReadFile(path)
	var out string
	switch {
	case errors.Is(err, os.ErrNotExist):
		out = "# Benchmarks\n\n" + block
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	default:
		s := string(old)
		i, j := strings.Index(s, m.Begin), strings.Index(s, m.End)
		if i >= 0 && j > i {
			out = s[:i] + block + strings.TrimPrefix(s[j+len(m.End):], "\n")
		} else {
			out = strings.TrimRight(s, "\n") + "\n\n" + block
		}
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
