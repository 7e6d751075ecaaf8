package session

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/parley-chat/parley"
)

// conflictRetries bounds how often the Service re-reads a session and
// writes again after ErrConflict (another replica wrote the same session
// in between). Each retry costs a round trip and a short random pause
// (conflictBackoff), so writers that keep colliding drift apart; conflicts
// need two replicas writing one session within milliseconds, so the
// retries run out only under a pathological client.
const conflictRetries = 8

// conflictBackoff is the upper bound of the random pause before retry n
// (1-based): n times this, so colliding writers spread further each time.
const conflictBackoff = time.Millisecond

// backoff sleeps a random part of attempt*conflictBackoff, or until ctx ends.
func backoff(ctx context.Context, attempt int) {
	t := time.NewTimer(rand.N(time.Duration(attempt+1) * conflictBackoff))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// How a turn found the engine's KV cache (Turn.KVCache), for the
// parley_session_turns_total metric.
const (
	KVNew     = "new"     // the session had no history: nothing to reuse
	KVWarm    = "warm"    // this replica committed the history last and the engine reused cached tokens
	KVRebuilt = "rebuilt" // the history came from the store (another replica, or a restart): the cache was rebuilt
)

// KVCache says how the turn found the KV cache: KVNew, KVWarm or
// KVRebuilt. Valid after the final event.
func (t *Turn) KVCache() string { return t.kv }

// commit appends the turn to the session and stores it with put (the
// service's put, or an unstored turn's capture, which never conflicts).
// When the store reports a conflict (a shared store that another replica
// wrote since the turn began), it re-reads the session and appends the turn
// to what is stored now, so neither replica's turn is lost or stored twice;
// reapply (when not nil) first redoes the turn's other changes on that copy.
func (s *Service) commit(ctx context.Context, who parley.Caller, put func(context.Context, *Session) error, sess *Session, turn []parley.Message, reapply func(*Session)) error {
	sess.Messages = append(sess.Messages, turn...)
	for attempt := 0; ; attempt++ {
		err := put(ctx, sess)
		if !errors.Is(err, ErrConflict) || attempt == conflictRetries {
			return err
		}
		backoff(ctx, attempt)
		fresh, err := s.load(ctx, who, sess.ID, sess.Model)
		if err != nil {
			return err
		}
		*sess = *fresh
		if reapply != nil {
			reapply(sess)
		}
		sess.Messages = append(sess.Messages, turn...)
	}
}

// servedMax bounds servedSet: past it, the set forgets arbitrary sessions
// (their next turn counts as rebuilt, which only affects the metric).
const servedMax = 8192

// servedSet remembers the version of each session this Service committed
// last, to tell a turn that continues this replica's own history (its KV
// cache may be warm) from one that resumes another replica's.
type servedSet struct {
	mu sync.Mutex
	m  map[string]time.Time // session id -> Updated of our last commit
}

func (v *servedSet) record(id string, updated time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = make(map[string]time.Time)
	}
	if _, ok := v.m[id]; !ok && len(v.m) >= servedMax {
		for k := range v.m {
			delete(v.m, k)
			break
		}
	}
	v.m[id] = updated
}

func (v *servedSet) holds(id string, updated time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.m[id]
	return ok && t.Equal(updated)
}
