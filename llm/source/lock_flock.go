//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package source

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockPoll is how often a waiting download retries the lock.
const lockPoll = 200 * time.Millisecond

// lockFile takes an exclusive flock on path (created if missing), waiting
// until it is free or ctx is done. flock locks belong to the open file, so
// two goroutines of one process exclude each other as two processes do, and
// the kernel drops the lock if the process dies. The lock file is left in
// place: removing it would race with a waiter that has it open.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	fd := int(f.Fd())
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(fd, syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		t := time.NewTimer(lockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("wait for another download of the same file: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}
