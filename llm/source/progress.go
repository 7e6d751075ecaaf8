package source

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress bar defaults.
const (
	barWidth = 30 // cells between the brackets
	// ttyInterval is the least time between redraws on a terminal.
	ttyInterval = 100 * time.Millisecond
	// lineInterval is the least time between lines when the output is not
	// a terminal (a log file, CI): one line every few seconds, not a flood.
	lineInterval = 5 * time.Second
	// minRateWindow is how long a transfer must have run before a rate is
	// shown; earlier figures are noise.
	minRateWindow = 500 * time.Millisecond
)

// ProgressBar renders download progress. On a terminal it redraws one line
// in place: "\r[=============>                ] 45% 12.3/27.0 MB 3.1 MB/s"; on
// anything else it writes that text as a line every few seconds and at the
// end. Its Update method is the callback for WithProgress. It is safe for
// concurrent use; write errors are ignored (progress is best effort).
type ProgressBar struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	interval time.Duration
	now      func() time.Time

	// State of the current transfer; reset when it completes.
	started   bool
	start     time.Time // first Update of this transfer
	startDone int64     // bytes already there at start (a resumed partial file): not counted in the rate
	lastDraw  time.Time
	drawn     bool // something of this transfer has been written
	lastLen   int  // length of the line on screen (tty), to blank leftovers
	onScreen  bool // a tty line is drawn without its newline
	pending   bool // the latest state has not been written
	done      int64
	total     int64
}

// BarOption configures a ProgressBar.
type BarOption func(*ProgressBar)

// BarTTY forces terminal (true) or line (false) rendering instead of
// detecting it from the writer.
func BarTTY(tty bool) BarOption { return func(b *ProgressBar) { b.tty = tty } }

// BarInterval sets the least time between two draws in the middle of a
// transfer (default 100ms on a terminal, 5s otherwise).
func BarInterval(d time.Duration) BarOption { return func(b *ProgressBar) { b.interval = d } }

// BarClock replaces time.Now (tests).
func BarClock(now func() time.Time) BarOption { return func(b *ProgressBar) { b.now = now } }

// NewProgressBar returns a bar that draws on w. It draws in place when w is
// a terminal (a character device), line by line otherwise.
func NewProgressBar(w io.Writer, opts ...BarOption) *ProgressBar {
	b := &ProgressBar{w: w, tty: isTerminal(w), now: time.Now}
	for _, opt := range opts {
		opt(b)
	}
	if b.interval == 0 {
		b.interval = lineInterval
		if b.tty {
			b.interval = ttyInterval
		}
	}
	return b
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Update records progress (bytes done of total; total < 0 if unknown) and
// draws it if the interval has passed or the transfer is complete.
func (b *ProgressBar) Update(done, total int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if !b.started {
		b.started, b.start, b.startDone = true, now, done
	}
	b.done, b.total, b.pending = done, total, true
	complete := total >= 0 && done >= total
	// The first update of a transfer is always drawn, so a slow start shows.
	if !complete && b.drawn && now.Sub(b.lastDraw) < b.interval {
		return
	}
	b.draw(now)
	if complete {
		b.endLine()
		b.started = false
	}
}

// Finish writes the latest state if it was not yet shown and ends the line,
// so whatever is printed next starts on its own line. Call it when the
// transfer ends, also on error. It is idempotent.
func (b *ProgressBar) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending {
		b.draw(b.now())
	}
	b.endLine()
	b.started = false
}

// draw writes the current state. Caller holds mu.
func (b *ProgressBar) draw(now time.Time) {
	line := b.render(now)
	if b.tty {
		pad := ""
		if n := b.lastLen - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprint(b.w, "\r"+line+pad)
		b.lastLen = len(line)
		b.onScreen = true
	} else {
		fmt.Fprintln(b.w, line)
	}
	b.lastDraw, b.drawn, b.pending = now, true, false
}

// endLine ends a tty line left open by draw. Caller holds mu.
func (b *ProgressBar) endLine() {
	if b.onScreen {
		fmt.Fprintln(b.w)
	}
	b.onScreen, b.lastLen, b.drawn = false, 0, false
}

// render formats "[====>   ] 45% 12.3/27.0 MB 3.1 MB/s", or "12.3 MB 3.1
// MB/s" when the total is unknown. Sizes are decimal (1 MB = 10^6 bytes), in
// GB from 1 GB up.
func (b *ProgressBar) render(now time.Time) string {
	done, total := b.done, b.total
	unit, div := "MB", 1e6
	if max(done, total) >= 1e9 {
		unit, div = "GB", 1e9
	}
	var s strings.Builder
	if total > 0 {
		frac := min(float64(done)/float64(total), 1)
		cells := int(frac * barWidth)
		s.WriteByte('[')
		s.WriteString(strings.Repeat("=", cells))
		if cells < barWidth {
			s.WriteByte('>')
			s.WriteString(strings.Repeat(" ", barWidth-cells-1))
		}
		fmt.Fprintf(&s, "] %d%% %.1f/%.1f %s", int(frac*100), float64(done)/div, float64(total)/div, unit)
	} else {
		fmt.Fprintf(&s, "%.1f %s", float64(done)/div, unit)
	}
	if el := now.Sub(b.start); el >= minRateWindow {
		fmt.Fprintf(&s, " %.1f MB/s", float64(done-b.startDone)/1e6/el.Seconds())
	}
	return s.String()
}
