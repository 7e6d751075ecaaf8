package session

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// janitor deletes expired sessions every interval on its own goroutine.
// Its owner (a store) stops it with stop, which returns after the goroutine
// has ended, so no sweep runs after the store closes its database.
type janitor struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned
}

// startJanitor runs sweep every interval until stop. sweep gets a context
// that is cancelled by stop, so a long sweep ends early too.
func startJanitor(interval time.Duration, log *zap.Logger, sweep func(context.Context) (int, error)) *janitor {
	ctx, cancel := context.WithCancel(context.Background())
	j := &janitor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(j.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, err := sweep(ctx)
			if err != nil && ctx.Err() == nil {
				// No caller to return it to: the janitor is the end of this error.
				log.Warn("expire sessions", zap.Error(err))
			}
			if n > 0 {
				log.Info("expired idle sessions", zap.Int("count", n))
			}
		}
	}()
	return j
}

// stop ends the goroutine and waits for it. It is safe on a nil janitor.
func (j *janitor) stop() {
	if j == nil {
		return
	}
	j.cancel()
	<-j.done
}
