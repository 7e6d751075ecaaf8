// Package proc runs the server processes that tests and tools start
// (bin/parley, ollama serve) on loopback: a free port to give them, a watch
// on their exit, and a wait until they answer over HTTP. It is never needed
// by the server itself.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"sync"
	"time"
)

// FreeAddr returns a loopback host:port whose port was free a moment ago.
// Another process may take it before the caller's server listens on it: a
// small race, accepted for servers that take their address as a flag.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// Proc is a started process whose exit is watched. It owns one goroutine,
// which waits for the process and ends when it does; whoever started the
// process must see it end (Done), so that goroutine ends too.
type Proc struct {
	Cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and err is set
	err  error         // Cmd.Wait's result
}

// Start starts cmd (set its output, environment and attributes first) and
// watches its exit.
func Start(cmd *exec.Cmd) (*Proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has exited (and its output is copied).
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the exit error (nil for exit status 0); valid once Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// WaitFor waits up to d for the process to exit and reports whether it did,
// with its exit error.
func (p *Proc) WaitFor(d time.Duration) (exited bool, err error) {
	select { // an exit already seen wins over a timer that fires at once
	case <-p.done:
		return true, p.err
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true, p.err
	case <-t.C:
		return false, nil
	}
}

// Kill kills the process, if it still runs, and waits for its exit.
func (p *Proc) Kill() {
	p.Cmd.Process.Kill()
	<-p.done
}

// ErrExited is wrapped by WaitHTTP's error when the process ended first.
var ErrExited = errors.New("the process exited")

// WaitHTTP polls url with GET until it answers 200 OK, the process exits
// (an error wrapping ErrExited and the exit error), or ctx ends (ctx's
// error). Each poll is bounded, and no connection is kept between polls.
func (p *Proc) WaitHTTP(ctx context.Context, url string) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%w (%v) before %s answered", ErrExited, p.err, url)
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer 200: %w", url, ctx.Err())
		case <-tick.C:
		}
	}
}

// Buffer collects a process's output: exec copies into it from its own
// goroutine while the caller may read it. Safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
