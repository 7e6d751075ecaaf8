package responses

// OpenAI's Conversations API (the routes are listed with the Responses
// API's in responses.go): a conversation is a session, its items are
// the session's system prompt and messages.

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

type conversationObject struct {
	ID        string            `json:"id"`
	Object    string            `json:"object"` // "conversation"
	CreatedAt int64             `json:"created_at"`
	Metadata  map[string]string `json:"metadata"`
}

// conversationItems is every item of a conversation, oldest first: its
// system prompt (when it has one), then its messages.
func conversationItems(sess *session.Session) []messageItem {
	items := make([]messageItem, 0, len(sess.Messages)+1)
	if sess.System != "" {
		items = append(items, newMessageItem(session.SystemItemID(sess.ID), parley.Message{Role: parley.RoleSystem, Content: sess.System}))
	}
	sc := newServerCalls(sess.Messages)
	lists := conversationLists(sess, sc)
	for i, m := range sess.Messages {
		items = append(items, lists[sess.Trimmed+i]...)
		items = append(items, itemsOf(sess.ID, sess.Trimmed+i, m, sc)...)
	}
	return items
}

func newConversationObject(sess *session.Session) conversationObject {
	meta := sess.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	return conversationObject{ID: session.ConversationID(sess.ID), Object: "conversation", CreatedAt: sess.Created.Unix(), Metadata: meta}
}

// conversationPathID is the session id that the conversation id in the
// path's :id names (it reads no store).
func conversationPathID(c echo.Context) (string, error) {
	sid, ok := session.ConversationSession(c.Param("id"))
	if !ok {
		return "", parley.Errorf(parley.ENotFound, "no such conversation")
	}
	return sid, nil
}

type conversationBody struct {
	Items    json.RawMessage   `json:"items"`
	Metadata map[string]string `json:"metadata"`
	Title    *string           `json:"title"` // an update's new title (Parley's; kept in metadata's "title")
}

func readConversationBody(c echo.Context, allowEmpty bool) (*conversationBody, []parley.Message, error) {
	body, err := apicore.ReadBody(c)
	if err != nil {
		return nil, nil, err
	}
	var req conversationBody
	if len(bytes.TrimSpace(body)) == 0 && allowEmpty {
		return &req, nil, nil
	}
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return nil, nil, err
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, nil, err
	}
	if bytes.HasPrefix(bytes.TrimSpace(req.Items), []byte(`"`)) {
		return nil, nil, parley.FieldErrorf("items", "must be an array of message items")
	}
	msgs, err := parseInput(req.Items, "items", nil, nil, false)
	if err != nil {
		return nil, nil, err
	}
	return &req, msgs, nil
}

// loadConversation reads the stored conversation the path's :id names.
func (s *API) loadConversation(c echo.Context) (*session.Session, error) {
	sid, err := conversationPathID(c)
	if err != nil {
		return nil, err
	}
	return s.convs.Conversation(c.Request().Context(), apicore.FactsOf(c).Caller, sid)
}

// CreateConversation is POST /v1/conversations.
func (s *API) CreateConversation(c echo.Context) error {
	model, err := s.core.ResolveModel(c.QueryParam("model")) // the default model, with several: the conversation keeps it
	if err != nil {
		return err
	}
	req, msgs, err := readConversationBody(c, true)
	if err != nil {
		return err
	}
	sess, err := s.convs.CreateConversation(c.Request().Context(), apicore.FactsOf(c).Caller, model, msgs, req.Metadata)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newConversationObject(sess))
}

// GetConversation is GET /v1/conversations/:id.
func (s *API) GetConversation(c echo.Context) error {
	sess, err := s.loadConversation(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newConversationObject(sess))
}

// UpdateConversation is POST /v1/conversations/:id (metadata only).
func (s *API) UpdateConversation(c echo.Context) error {
	sid, err := conversationPathID(c)
	if err != nil {
		return err
	}
	req, _, err := readConversationBody(c, false)
	if err != nil {
		return err
	}
	if apicore.IsSet(req.Items) {
		return parley.FieldErrorf("items", "add items with POST /v1/conversations/{id}/items")
	}
	if _, titled := req.Metadata[session.TitleKey]; req.Title != nil && *req.Title != "" && !titled && len(req.Metadata) >= maxMetadataKeys {
		// Refused before the metadata is written: Rename would refuse the title after it.
		return parley.FieldErrorf("title", "the metadata holds %d keys, the most, and the title would be one more", maxMetadataKeys)
	}
	ctx, who := c.Request().Context(), apicore.FactsOf(c).Caller
	var sess *session.Session
	if req.Metadata != nil || req.Title == nil {
		if sess, err = s.convs.SetMetadata(ctx, who, sid, req.Metadata); err != nil {
			return err
		}
	}
	if req.Title != nil {
		if sess, err = s.convs.Rename(ctx, who, sid, *req.Title); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, newConversationObject(sess))
}

// DeleteConversation is DELETE /v1/conversations/:id.
func (s *API) DeleteConversation(c echo.Context) error {
	sid, err := conversationPathID(c)
	if err != nil {
		return err
	}
	if err := s.convs.DeleteConversation(c.Request().Context(), apicore.FactsOf(c).Caller, sid); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, deletedObject{ID: session.ConversationID(sid), Object: "conversation.deleted", Deleted: true})
}

// ListItems is GET /v1/conversations/:id/items.
func (s *API) ListItems(c echo.Context) error {
	sess, err := s.loadConversation(c)
	if err != nil {
		return err
	}
	return listItems(c, conversationItems(sess))
}

// AddItems is POST /v1/conversations/:id/items.
func (s *API) AddItems(c echo.Context) error {
	sid, err := conversationPathID(c)
	if err != nil {
		return err
	}
	_, msgs, err := readConversationBody(c, false)
	if err != nil {
		return err
	}
	if len(msgs) == 0 {
		return parley.FieldErrorf("items", "at least one item is required")
	}
	sess, first, err := s.convs.AddItems(c.Request().Context(), apicore.FactsOf(c).Caller, sid, msgs)
	if err != nil {
		return err
	}
	var added []messageItem
	sc := newServerCalls(sess.Messages)
	for abs := first; abs < sess.Next(); abs++ {
		if span := sess.Span(abs, abs+1); len(span) == 1 {
			added = append(added, itemsOf(sid, abs, span[0], sc)...)
		}
	}
	l := itemList{Object: "list", Data: []messageItem{}}
	l.Data = append(l.Data, added...)
	if len(added) > 0 {
		l.FirstID, l.LastID = &added[0].ID, &added[len(added)-1].ID
	}
	return c.JSON(http.StatusOK, l)
}

// GetItem is GET /v1/conversations/:id/items/:item.
func (s *API) GetItem(c echo.Context) error {
	sess, err := s.loadConversation(c)
	if err != nil {
		return err
	}
	want := session.CanonicalItemID(sess.ID, c.Param("item"))
	for _, it := range conversationItems(sess) {
		if it.ID == want {
			return c.JSON(http.StatusOK, it)
		}
	}
	return parley.Errorf(parley.ENotFound, "no such item")
}

// DeleteItem is DELETE /v1/conversations/:id/items/:item; it returns
// the conversation.
func (s *API) DeleteItem(c echo.Context) error {
	sid, err := conversationPathID(c)
	if err != nil {
		return err
	}
	abs, ok := session.ItemPosition(sid, c.Param("item"))
	if !ok {
		return parley.Errorf(parley.ENotFound, "no such item")
	}
	sess, err := s.convs.DeleteItem(c.Request().Context(), apicore.FactsOf(c).Caller, sid, abs)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newConversationObject(sess))
}

// The caller's conversations, beyond OpenAI's Conversations API: the list
// the chat page's sidebar shows (and any client may read), renaming, and
// forking (the page's edit-and-resend). Every route reaches only the
// caller's own conversations (apicore.Facts.Caller): another user's id is
// answered 404, the same as an unknown one.
//
//	GET  /v1/conversations?limit=&after=&q=   newest first, paged, filtered by title
//	POST /v1/conversations/:id/fork            {"messages": N}: a copy holding the first N messages

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
	page, more, err := s.convs.ListConversations(c.Request().Context(), apicore.FactsOf(c).Caller, lq)
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
	sess, err := s.convs.Fork(c.Request().Context(), apicore.FactsOf(c).Caller, sid, *req.Messages)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newConversationObject(sess))
}
