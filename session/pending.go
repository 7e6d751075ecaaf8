package session

import (
	"context"
	"fmt"

	"github.com/parley-chat/parley"
)

// FinishInterrupted is the finish reason of a durable turn's record while
// its reply runs: what a restart finds when the server died under it.
const FinishInterrupted = "interrupted"

// storePending stores sess with the turn's prompt and an empty reply marked
// interrupted (a Responses record of the turn says incomplete, finish
// interrupted), before the reply starts: a crash during the reply leaves
// the turn stored as interrupted rather than lost. sess itself is left as
// it was, but for its version (Created, Updated), so the turn's commit
// replaces the pending write instead of conflicting with it.
func (s *Service) storePending(ctx context.Context, sess *Session, input parley.Message) error {
	p := sess.Clone()
	p.Messages = append(p.Messages, input, parley.Message{Role: parley.RoleAssistant, Interrupted: true})
	if n := len(p.Responses); n > 0 {
		r := &p.Responses[n-1]
		r.Status, r.Finish, r.Hash = StatusIncomplete, FinishInterrupted, textHash("")
	}
	if err := s.put(ctx, p); err != nil {
		return fmt.Errorf("store pending turn: %w", err)
	}
	sess.Created, sess.Updated = p.Created, p.Updated
	return nil
}
