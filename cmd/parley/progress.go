package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// loadProgress draws the model load progress on a terminal (a bar redrawn in
// place) and stays silent elsewhere, where the structured log says enough.
type loadProgress struct {
	mu   sync.Mutex
	w    io.Writer
	tty  bool
	last int // percent last drawn
}

func newLoadProgress(w io.Writer) *loadProgress {
	f, ok := w.(*os.File)
	return &loadProgress{w: w, tty: ok && isTerminal(f), last: -1}
}

func (p *loadProgress) update(frac float32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pct := int(frac * 100)
	if !p.tty || pct == p.last {
		return
	}
	p.last = pct
	const width = 30
	n := pct * width / 100
	fmt.Fprintf(p.w, "\rloading model [%s%s] %3d%%", strings.Repeat("=", n), strings.Repeat(" ", width-n), pct)
}

func (p *loadProgress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.last >= 0 {
		fmt.Fprintln(p.w)
	}
}
