//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package source

import "context"

// lockFile is a no-op where flock is unavailable: concurrent downloads of the
// same file into one cache are then not serialised.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	return func() {}, ctx.Err()
}
