package responses

// The caller's conversations, beyond OpenAI's Conversations API: the list
// the chat page's sidebar shows (and any client may read), renaming, and
// forking (the page's edit-and-resend). Every route reaches only the
// caller's own conversations (parley.UserFrom): another user's id is
// answered 404, the same as an unknown one.
//
//	GET  /v1/conversations?limit=&after=&q=   newest first, paged, filtered by title
//	POST /v1/conversations/:id/fork            {"messages": N}: a copy holding the first N messages

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// conversationListItem is one conversation of GET /v1/conversations: the
// conversation object with what a list shows besides.
type conversationListItem struct {
	conversationObject
	Session   string `json:"session"` // the id a chat socket resumes (?session=)
	Title     string `json:"title"`   // metadata's title, else the first prompt's first line
	UpdatedAt int64  `json:"updated_at"`
	Messages  int    `json:"messages"` // in its history
}

type conversationList struct {
	Object  string                 `json:"object"` // "list"
	Data    []conversationListItem `json:"data"`
	FirstID *string                `json:"first_id"`
	LastID  *string                `json:"last_id"`
	HasMore bool                   `json:"has_more"`
}

// ListConversations is GET /v1/conversations.
func (s *API) ListConversations(c echo.Context) error {
	q := c.QueryParams()
	lq := session.ListQuery{Query: q.Get("q")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > session.MaxListLimit {
			return parley.FieldErrorf("limit", "must be an integer from 1 to %d", session.MaxListLimit)
		}
		lq.Limit = n
	}
	if v := q.Get("after"); v != "" {
		sid, ok := session.ConversationSession(v)
		if !ok {
			return parley.FieldErrorf("after", "is not a conversation id")
		}
		lq.After = sid
	}
	page, more, err := s.convs.ListConversations(c.Request().Context(), lq)
	if err != nil {
		return err
	}
	l := conversationList{Object: "list", Data: []conversationListItem{}, HasMore: more}
	for _, p := range page {
		meta := p.Metadata
		if meta == nil {
			meta = map[string]string{}
		}
		l.Data = append(l.Data, conversationListItem{
			conversationObject: conversationObject{ID: session.ConversationID(p.ID), Object: "conversation", CreatedAt: p.Created.Unix(), Metadata: meta},
			Session:            p.ID, Title: p.Title, UpdatedAt: p.Updated.Unix(), Messages: p.Messages,
		})
	}
	if n := len(l.Data); n > 0 {
		l.FirstID, l.LastID = &l.Data[0].ID, &l.Data[n-1].ID
	}
	return c.JSON(http.StatusOK, l)
}

// ForkConversation is POST /v1/conversations/:id/fork.
func (s *API) ForkConversation(c echo.Context) error {
	sid, err := conversationPathID(c)
	if err != nil {
		return err
	}
	body, err := apicore.ReadBody(c)
	if err != nil {
		return err
	}
	var req struct {
		Messages *int `json:"messages"`
	}
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return err
	}
	if req.Messages == nil {
		return parley.FieldErrorf("messages", "is required: how many of the conversation's messages the copy keeps")
	}
	sess, err := s.convs.Fork(c.Request().Context(), sid, *req.Messages)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newConversationObject(sess))
}
