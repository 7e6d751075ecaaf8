//go:build unix

package session

import (
	"errors"
	"os"
	"syscall"
)

// flockHeld reports whether another process holds a lock on f (bbolt's
// flock): a shared lock taken without waiting is refused while a writer
// holds the file. The lock taken here is released at once.
func flockHeld(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
