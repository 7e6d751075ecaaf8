package session

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/parley-chat/parley"
)

// Lister is a Store that lists one user's sessions (every store here is
// one): the conversation list of the chat page and GET /v1/conversations.
type Lister interface {
	// UserSessions returns the ids of user's stored sessions, the most
	// recently updated first. It may name sessions that have expired or
	// are being deleted: Get tells.
	UserSessions(ctx context.Context, user string) ([]string, error)
}

// TitleKey is the metadata key a conversation's title is kept under once
// it is renamed; until then the title is its first prompt.
const TitleKey = "title"

// maxTitleRunes bounds a title made from a first prompt.
const maxTitleRunes = 80

// Title is how a conversation is named in a list: its metadata's title
// when it was given one, else the first line of its first prompt (cut to
// 80 characters), else "".
func (s *Session) Title() string {
	if t := s.Metadata[TitleKey]; t != "" {
		return t
	}
	for _, m := range s.Messages {
		if m.Role != parley.RoleUser {
			continue
		}
		t := strings.TrimSpace(m.Content)
		if i := strings.IndexByte(t, '\n'); i >= 0 {
			t = strings.TrimSpace(t[:i])
		}
		if utf8.RuneCountInString(t) > maxTitleRunes {
			r := []rune(t)
			t = strings.TrimSpace(string(r[:maxTitleRunes-1])) + "…"
		}
		return t
	}
	return ""
}

// Listing is one conversation as a list shows it.
type Listing struct {
	ID       string // the session id
	Title    string
	Created  time.Time
	Updated  time.Time
	Messages int // messages in its history
	Metadata map[string]string
}

// ListQuery selects a page of a user's conversations.
type ListQuery struct {
	Limit int    // conversations in the page, 1 to 100 (0: 20)
	After string // a session id: the page starts after it ("" = from the newest)
	Query string // only titles that contain it, ignoring case ("" = all)
}

// Defaults and bounds of ListQuery.Limit.
const (
	DefaultListLimit = 20
	MaxListLimit     = 100
)

// ListConversations returns a page of who's user's conversations, the most
// recently updated first, and whether more follow. A conversation is a
// session that holds a message or metadata: a chat socket opened and never
// used is not one. After naming a conversation that is not in the list
// (someone else's, or deleted) is a parley ENotFound error.
func (s *Service) ListConversations(ctx context.Context, who parley.Caller, q ListQuery) (page []Listing, more bool, err error) {
	lister, ok := s.store.(Lister)
	if !ok {
		return nil, false, parley.Errorf(parley.EUnavailable, "this session store cannot list conversations")
	}
	if q.Limit <= 0 {
		q.Limit = DefaultListLimit
	}
	q.Limit = min(q.Limit, MaxListLimit)
	ids, err := lister.UserSessions(ctx, who.User)
	if err != nil {
		return nil, false, err
	}
	if q.After != "" {
		i := 0
		for i < len(ids) && ids[i] != q.After {
			i++
		}
		if i == len(ids) {
			return nil, false, parley.FieldErrorf("after", "names no conversation of yours")
		}
		ids = ids[i+1:]
	}
	needle := strings.ToLower(q.Query)
	for _, id := range ids {
		sess, err := s.get(ctx, who, id)
		if parley.ErrorCode(err) == parley.ENotFound {
			continue // expired, or deleted since the index was read
		} else if err != nil {
			return nil, false, err
		}
		if len(sess.Messages) == 0 && len(sess.Metadata) == 0 {
			continue
		}
		l := Listing{ID: sess.ID, Title: sess.Title(), Created: sess.Created, Updated: sess.Updated,
			Messages: len(sess.Messages), Metadata: sess.Metadata}
		if needle != "" && !strings.Contains(strings.ToLower(l.Title), needle) {
			continue
		}
		if len(page) == q.Limit {
			return page, true, nil
		}
		page = append(page, l)
	}
	return page, false, nil
}

// MaxMetadataKeys bounds a conversation's metadata (OpenAI's limit); a
// title set by Rename is one of its keys.
const MaxMetadataKeys = 16

// Rename sets conversation sid's title ("" returns it to its first
// prompt), keeping its other metadata. A conversation untitled so far whose
// metadata holds MaxMetadataKeys keys is refused: the title would be one
// more, and which other key to drop is the client's to say.
func (s *Service) Rename(ctx context.Context, who parley.Caller, sid, title string) (*Session, error) {
	if err := checkTitle(title); err != nil {
		return nil, err
	}
	var out *Session
	err := s.edit(ctx, who, sid, func(sess *Session) error {
		_, titled := sess.Metadata[TitleKey]
		switch {
		case title == "":
			delete(sess.Metadata, TitleKey)
		case !titled && len(sess.Metadata) >= MaxMetadataKeys:
			return parley.FieldErrorf("title", "the conversation's metadata holds %d keys, the most, and the title would be one more: remove a key first", MaxMetadataKeys)
		default:
			if sess.Metadata == nil {
				sess.Metadata = map[string]string{}
			}
			sess.Metadata[TitleKey] = title
		}
		out = sess
		return nil
	})
	return out, err
}

// maxTitleBytes bounds a title set by Rename (the Conversations API's
// metadata values have the same bound).
const maxTitleBytes = 512

func checkTitle(t string) error {
	if len(t) > maxTitleBytes || !utf8.ValidString(t) {
		return parley.FieldErrorf("title", "must be UTF-8 text of at most %d bytes", maxTitleBytes)
	}
	return nil
}

// Fork stores a copy of conversation sid holding its first keep messages
// (its system prompt, settings and metadata, but not its title) under a new id of who's
// user: the chat page's edit-and-resend, which keeps the original as it
// was. keep must be at most the messages the conversation holds. It counts
// against the client's creation limits like any new session.
func (s *Service) Fork(ctx context.Context, who parley.Caller, sid string, keep int) (*Session, error) {
	sess, err := s.Conversation(ctx, who, sid)
	if err != nil {
		return nil, err
	}
	if keep < 0 || keep > len(sess.Messages) {
		return nil, parley.FieldErrorf("messages", "must be between 0 and %d, the messages the conversation holds", len(sess.Messages))
	}
	if err := s.mayCreate(ctx, who); err != nil {
		return nil, err
	}
	f, err := s.fork(who, sess, sess.Trimmed+keep)
	if err != nil {
		return nil, err
	}
	// The copy is named by its own first prompt, not the original's title.
	delete(f.Metadata, TitleKey)
	if err := s.put(ctx, f); err != nil {
		return nil, err
	}
	return f, nil
}
