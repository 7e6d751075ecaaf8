package session

import (
	"context"
	"maps"
	"strings"

	"github.com/parley-chat/parley"
)

// The Conversations API's view of sessions (see responses.go for how
// conversations, responses and items map onto a session): a conversation
// is a stored session, its items are the session's messages.

// ConversationSession returns the session id of a conversation id. A bare
// session id is accepted too (the id a WebSocket chat shows).
func ConversationSession(id string) (string, bool) {
	sid := strings.TrimPrefix(id, ConversationPrefix)
	return sid, ValidID(sid)
}

// CreateConversation stores a new session holding msgs (system messages
// set its system prompt; without one it gets the service's default),
// model ("" the default) and metadata, owned by who; it counts against the client's creation
// rate and the store's per-client cap.
func (s *Service) CreateConversation(ctx context.Context, who parley.Caller, model string, msgs []parley.Message, metadata map[string]string) (*Session, error) {
	if err := s.creates.allow(who.Client); err != nil {
		return nil, err
	}
	sess, err := s.newSession(who, model)
	if err != nil {
		return nil, err
	}
	sess.Metadata = maps.Clone(metadata)
	sess.addItems(msgs)
	if err := s.put(ctx, sess); err != nil {
		return nil, err
	}
	return sess, nil
}

// Conversation returns the stored session sid.
func (s *Service) Conversation(ctx context.Context, who parley.Caller, sid string) (*Session, error) {
	if !ValidID(sid) {
		return nil, errNotFound()
	}
	return s.get(ctx, who, sid)
}

// SetMetadata replaces a conversation's metadata.
func (s *Service) SetMetadata(ctx context.Context, who parley.Caller, sid string, metadata map[string]string) (*Session, error) {
	var out *Session
	err := s.edit(ctx, who, sid, func(sess *Session) error {
		sess.Metadata = maps.Clone(metadata)
		out = sess
		return nil
	})
	return out, err
}

// DeleteConversation deletes the session sid; it must exist.
func (s *Service) DeleteConversation(ctx context.Context, who parley.Caller, sid string) error {
	unlock, err := s.lockSession(ctx, sid)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := s.get(ctx, who, sid); err != nil {
		return err
	}
	return s.store.Delete(ctx, sid)
}

// AddItems appends msgs to conversation sid without a reply and returns
// the absolute position of the first one (system messages replace the
// system prompt and take no position).
func (s *Service) AddItems(ctx context.Context, who parley.Caller, sid string, msgs []parley.Message) (*Session, int, error) {
	var out *Session
	first := 0
	err := s.edit(ctx, who, sid, func(sess *Session) error {
		first = sess.Next()
		sess.addItems(msgs)
		out = sess
		return nil
	})
	return out, first, err
}

// DeleteItem removes the message at absolute position abs from
// conversation sid; the responses it belonged to are forgotten.
func (s *Service) DeleteItem(ctx context.Context, who parley.Caller, sid string, abs int) (*Session, error) {
	var out *Session
	err := s.edit(ctx, who, sid, func(sess *Session) error {
		if sess.pos(abs) < 0 {
			return parley.Errorf(parley.ENotFound, "no such item")
		}
		sess.removeSpan(abs, abs+1)
		out = sess
		return nil
	})
	return out, err
}
