package source_test

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/llm/source"
)

// fakeClock is a settable time source.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *fakeClock               { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

// bar builds "[====>    ]": cells '=' out of n, then a '>' head if head.
func bar(cells int, head bool, n int) string {
	s := "[" + strings.Repeat("=", cells)
	if head {
		s += ">" + strings.Repeat(" ", n-cells-1)
	}
	return s + "]"
}

func TestProgressBar(t *testing.T) {
	const MB = 1_000_000
	type step struct {
		after       time.Duration // clock advance before the update
		done, total int64
		finish      bool   // call Finish instead of Update
		want        string // output written by this step
	}
	tests := []struct {
		name  string
		tty   bool
		steps []step
	}{
		{name: "terminal", tty: true, steps: []step{
			{done: 0, total: 27 * MB, want: "\r" + bar(0, true, 30) + " 0% 0.0/27.0 MB"},
			// Within the redraw interval: nothing drawn.
			{after: 50 * time.Millisecond, done: 1 * MB, total: 27 * MB, want: ""},
			{after: 950 * time.Millisecond, done: 3_100_000, total: 27 * MB, want: "\r" + bar(3, true, 30) + " 11% 3.1/27.0 MB 3.1 MB/s"},
			{after: 3 * time.Second, done: 12_300_000, total: 27 * MB, want: "\r" + bar(13, true, 30) + " 45% 12.3/27.0 MB 3.1 MB/s"},
			// Complete: drawn at once, line ended.
			{after: 10 * time.Millisecond, done: 27 * MB, total: 27 * MB, want: "\r" + bar(30, false, 30) + " 100% 27.0/27.0 MB 6.7 MB/s\n"},
			// Nothing left open: Finish writes nothing.
			{finish: true, want: ""},
		}},
		{name: "terminal, unknown total", tty: true, steps: []step{
			{done: 0, total: -1, want: "\r0.0 MB"},
			{after: time.Second, done: 12_345_678, total: -1, want: "\r12.3 MB 12.3 MB/s"},
			// One character shorter than the line before (padding checked below).
			{after: time.Second, done: 13 * MB, total: -1, want: "\r13.0 MB 6.5 MB/s"},
			{finish: true, want: "\n"},
			{finish: true, want: ""},
		}},
		{name: "lines", tty: false, steps: []step{
			{done: 0, total: 2_500_000_000, want: bar(0, true, 30) + " 0% 0.0/2.5 GB\n"},
			{after: 2 * time.Second, done: 100 * MB, total: 2_500_000_000, want: ""},
			{after: 3 * time.Second, done: 500 * MB, total: 2_500_000_000, want: bar(6, true, 30) + " 20% 0.5/2.5 GB 100.0 MB/s\n"},
			{after: time.Second, done: 600 * MB, total: 2_500_000_000, want: ""},
			// Finish shows the state not yet written.
			{finish: true, want: bar(7, true, 30) + " 24% 0.6/2.5 GB 100.0 MB/s\n"},
			{finish: true, want: ""},
		}},
		{name: "resumed transfer counts only new bytes in the rate", tty: false, steps: []step{
			{done: 20 * MB, total: 40 * MB, want: bar(15, true, 30) + " 50% 20.0/40.0 MB\n"},
			{after: 10 * time.Second, done: 40 * MB, total: 40 * MB, want: bar(30, false, 30) + " 100% 40.0/40.0 MB 2.0 MB/s\n"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			clock := newClock()
			b := source.NewProgressBar(&out, source.BarTTY(tt.tty), source.BarClock(clock.now))
			for i, s := range tt.steps {
				clock.add(s.after)
				out.Reset()
				if s.finish {
					b.Finish()
				} else {
					b.Update(s.done, s.total)
				}
				got := out.String()
				// A terminal line may carry trailing blanks that erase a longer one.
				if tt.tty && strings.HasPrefix(s.want, "\r") {
					got = strings.TrimRight(got, " ")
					if strings.HasSuffix(s.want, "\n") {
						got = strings.TrimRight(strings.TrimSuffix(out.String(), "\n"), " ") + "\n"
					}
				}
				if got != s.want {
					t.Fatalf("step %d: wrote %q, want %q", i, got, s.want)
				}
			}
		})
	}
}

// A shorter line on a terminal is padded to cover the previous one.
func TestProgressBarPadding(t *testing.T) {
	var out bytes.Buffer
	clock := newClock()
	b := source.NewProgressBar(&out, source.BarTTY(true), source.BarClock(clock.now))
	b.Update(0, -1)
	clock.add(time.Second)
	b.Update(123_456_789, -1) // "123.5 MB 123.5 MB/s"
	clock.add(time.Second)
	out.Reset()
	b.Update(124_000_000, -1) // "124.0 MB 62.0 MB/s": one character shorter
	if got, want := out.String(), "\r124.0 MB 62.0 MB/s "; got != want {
		t.Fatalf("wrote %q, want %q", got, want)
	}
}

// Only a character device is a terminal; a file or buffer gets lines.
func TestProgressBarDetectsTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := source.NewProgressBar(f)
	b.Update(0, 10)
	b.Update(10, 10)
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if s := string(data); strings.Contains(s, "\r") || strings.Count(s, "\n") != 2 {
		t.Fatalf("file output = %q, want two lines without carriage returns", s)
	}
}
