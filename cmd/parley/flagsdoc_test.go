package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// docTopic is one "### Title" flags table of docs/operations.md.
type docTopic struct {
	title string
	rows  [][]string // flag, environment, default, what it does
}

// readFlagsTables reads the tables under "## Flags and environment".
func readFlagsTables(t *testing.T) []docTopic {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []docTopic
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Flags and environment"
		case !in:
		case strings.HasPrefix(line, "### "):
			out = append(out, docTopic{title: strings.TrimPrefix(line, "### ")})
		case strings.HasPrefix(line, "| `--") && len(out) > 0:
			cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|"), "|")
			if len(cells) > 4 { // a pipe inside the last cell's text
				cells = append(cells[:3], strings.Join(cells[3:], "|"))
			}
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			out[len(out)-1].rows = append(out[len(out)-1].rows, cells)
		}
	}
	return out
}

// TestFlagsTableMatchesHelp: docs/operations.md lists every flag of
// `parley --help`, by the same topics in the same order, each with its
// environment variable; a default written as one literal is the flag's.
func TestFlagsTableMatchesHelp(t *testing.T) {
	var c config
	fs := declareFlags(&c, func(string) string { return "" }, io.Discard)
	var all []string
	fs.VisitAll(func(f *flag.Flag) { all = append(all, f.Name) })
	var topics []string
	for _, tp := range flagTopics {
		topics = append(topics, tp.flags...)
	}
	for _, name := range all {
		if n := strings.Count(" "+strings.Join(topics, " ")+" ", " "+name+" "); n != 1 {
			t.Errorf("--%s is in %d topics of flagTopics, want 1", name, n)
		}
	}
	for _, name := range topics {
		if fs.Lookup(name) == nil {
			t.Errorf("flagTopics names --%s, which is not a flag", name)
		}
	}

	doc := readFlagsTables(t)
	if len(doc) != len(flagTopics) {
		t.Fatalf("docs/operations.md has %d flag topics, --help %d", len(doc), len(flagTopics))
	}
	for i, tp := range flagTopics {
		d := doc[i]
		if d.title != tp.title {
			t.Errorf("topic %d: docs say %q, --help %q", i, d.title, tp.title)
		}
		var names []string
		for _, r := range d.rows {
			if len(r) != 4 {
				t.Errorf("%s: a row of %d cells: %q", tp.title, len(r), r)
				continue
			}
			name := strings.TrimPrefix(strings.Trim(r[0], "`"), "--")
			names = append(names, name)
			f := fs.Lookup(name)
			if f == nil {
				continue
			}
			if env := envName(name); !strings.HasPrefix(r[1], "`"+env+"`") && !(env == "" && r[1] == "") {
				t.Errorf("--%s: environment %q, want `%s`", name, r[1], env)
			}
			def := r[2]
			if strings.Count(def, "`") == 2 && strings.HasPrefix(def, "`") && strings.HasSuffix(def, "`") && !strings.HasPrefix(def, "`--") {
				if lit := strings.Trim(def, "`"); lit != f.DefValue && !sameDuration(lit, f.DefValue) {
					t.Errorf("--%s: docs say the default is %q, the flag's is %q", name, lit, f.DefValue)
				}
			}
		}
		if !slices.Equal(names, tp.flags) {
			t.Errorf("%s: docs list %v, --help %v", tp.title, names, tp.flags)
		}
	}

	var help bytes.Buffer
	printUsage(fs, &help)
	last := -1
	for _, tp := range flagTopics {
		i := strings.Index(help.String(), "\n"+tp.title+":\n")
		if i <= last {
			t.Errorf("--help: topic %q missing or out of order", tp.title)
		}
		last = i
	}
	for _, name := range all {
		if !strings.Contains(help.String(), "  --"+name) {
			t.Errorf("--help lacks --%s", name)
		}
	}
}

// sameDuration reports whether a and b are the same duration written two
// ways (24h and 24h0m0s).
func sameDuration(a, b string) bool {
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	return errA == nil && errB == nil && da == db
}
