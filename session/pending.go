package session

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// FinishInterrupted is the finish reason of a durable turn's record while
// its reply runs: what a restart finds when the server died under it.
const FinishInterrupted = "interrupted"

// A durable turn (every chat turn, and a background response) is stored
// before its reply starts: its input and an empty reply marked interrupted.
// While the reply runs, its text so far replaces that at checkpoints (after
// firstCheckpoint tokens, then each time the count doubles, at most
// maxCheckpointGap tokens apart), so a crash (kill -9, a lost machine) loses
// neither what the user typed nor more than a bounded tail of the reply.
// The turn's commit replaces the last of these writes.
const (
	firstCheckpoint  = 16  // tokens before the first checkpoint of a reply's text
	maxCheckpointGap = 256 // most tokens between two checkpoints
)

// nextCheckpoint is the token count of the checkpoint after one at n.
func nextCheckpoint(n int) int { return n + min(max(n, firstCheckpoint), maxCheckpointGap) }

// storePending stores sess with the turn's input and reply (empty before
// the reply starts; its text so far at a checkpoint) marked interrupted (a
// Responses record of the turn says incomplete, finish interrupted): a
// crash during the reply leaves the turn stored as interrupted rather than
// lost. sess itself is left as it was, but for its version (Created,
// Updated), so the next write (a checkpoint, the turn's commit) replaces
// this one instead of conflicting with it.
func (s *Service) storePending(ctx context.Context, sess *Session, input, reply parley.Message) error {
	p := sess.Clone()
	reply.Role, reply.Interrupted = parley.RoleAssistant, true
	p.Messages = append(p.Messages, input, reply)
	if n := len(p.Responses); n > 0 {
		r := &p.Responses[n-1]
		r.Status, r.Finish, r.Hash = StatusIncomplete, FinishInterrupted, textHash(reply.Content)
	}
	if err := s.put(ctx, p); err != nil {
		return fmt.Errorf("store pending turn: %w", err)
	}
	sess.Created, sess.Updated = p.Created, p.Updated
	return nil
}

// storePendingTurn is storePending of durable turn t's input before its
// reply starts. A chat turn (t.revert set) whose write meets another
// replica's (ErrConflict) starts again from a fresh copy, its own changes
// (a regenerate's drop) redone on it, as a commit does; sess becomes that
// copy. A Responses turn's conflict is returned.
func (s *Service) storePendingTurn(ctx context.Context, t *Turn, sess *Session) error {
	for attempt := 0; ; attempt++ {
		var reply parley.Message // empty; a Continue turn's: the reply it carries on
		if t.prefix != nil {
			reply = *t.prefix
		}
		err := s.storePending(ctx, sess, t.input, reply)
		if err == nil || !errors.Is(err, ErrConflict) || t.revert == nil || attempt == conflictRetries {
			return err
		}
		backoff(ctx, attempt)
		fresh, err := s.load(ctx, t.who, sess.ID, sess.Model)
		if err != nil {
			return err
		}
		t.revert = fresh.Clone()
		if t.reapply != nil {
			t.reapply(fresh)
		}
		*sess = *fresh
	}
}

// checkpointer stores a durable turn's reply so far as it grows (see
// firstCheckpoint). It belongs to the turn's goroutine.
type checkpointer struct {
	s         *Service
	sess      *Session
	input     parley.Message
	text      []byte // the answer so far (Token.Text of every event)
	reasoning []byte // the thought so far
	tokens    int
	next      int  // token count of the next checkpoint
	off       bool // a checkpoint failed: the commit decides from here
}

func (s *Service) newCheckpointer(sess *Session, input parley.Message, prefix *parley.Message) *checkpointer {
	c := &checkpointer{s: s, sess: sess, input: input, next: firstCheckpoint}
	if prefix != nil {
		c.text, c.reasoning = []byte(prefix.Content), []byte(prefix.Reasoning)
	}
	return c
}

// add records a token event and, when a checkpoint is due, stores the
// reply so far before the event goes on to the client: a client that has
// seen token n knows the store holds at least the text up to the last
// checkpoint at or before n.
func (c *checkpointer) add(ctx context.Context, ev parley.Event) {
	c.text = append(c.text, ev.Token.Text...)
	c.reasoning = append(c.reasoning, ev.Token.Reasoning...)
	c.tokens++
	if c.off || c.tokens < c.next {
		return
	}
	c.next = nextCheckpoint(c.tokens)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	reply := parley.Message{Content: string(c.text), Reasoning: string(c.reasoning)}
	if err := c.s.storePending(cctx, c.sess, c.input, reply); err != nil {
		// The reply goes on; its commit stores it (or says why not).
		c.off = true
		c.s.log.Warn("checkpoint of a reply failed; no more checkpoints for it",
			zap.String("session", c.sess.ID), zap.Int("tokens", c.tokens), zap.Error(err))
	}
}

// dropPending removes input's pending turn (input, then a reply marked
// interrupted) from sess's history, the last such pair, when it is there:
// a durable turn's own write, which a read of the store while the turn
// runs (a snapshot for a resuming client, a fresh copy after a conflict)
// must not show or keep twice. It is at the end, unless another replica
// committed a turn of the same session after it.
func dropPending(sess *Session, input parley.Message) {
	for i := len(sess.Messages) - 2; i >= 0; i-- {
		in, reply := sess.Messages[i], sess.Messages[i+1]
		if reply.Role == parley.RoleAssistant && reply.Interrupted &&
			in.Role == input.Role && in.Content == input.Content && in.ToolCallID == input.ToolCallID {
			sess.Messages = slices.Delete(sess.Messages, i, i+2)
			return
		}
	}
}
