package session

import (
	"context"
	"fmt"

	"github.com/parley-chat/parley"
)

// Snapshot reads turn t's session as stored now, and reports whether t is
// still pending: its reply has not ended, so the returned history holds
// neither its prompt nor its reply (the caller shows them as in flight).
// When pending is false the history is final for t: it holds the turn if
// it was stored, and it will not change on t's account afterwards. The read
// is ordered against the turn's commit (settle), so a session never shows
// a turn half way, and a resuming client never misses a turn that is
// committed behind its back.
func (s *Service) Snapshot(ctx context.Context, who parley.Caller, t *Turn) (sess *Session, pending bool, err error) {
	t.settleMu.Lock()
	defer t.settleMu.Unlock()
	sess, err = s.get(ctx, who, t.id)
	if err != nil {
		return nil, false, fmt.Errorf("snapshot session: %w", err)
	}
	if !t.settled && t.durable {
		dropPending(sess, t.input) // the turn's own pending write: shown as in flight
	}
	return sess, !t.settled, nil
}
