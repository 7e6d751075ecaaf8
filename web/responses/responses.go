// Package responses serves OpenAI's Responses and Conversations APIs over Parley's sessions:
//
//	POST   /v1/responses                      create (streamed as server-sent events when "stream": true)
//	GET    /v1/responses                      WebSocket mode: the same requests as "response.create" messages (socket.go)
//	GET    /v1/responses/:id                  a stored response
//	DELETE /v1/responses/:id                  forget a response (its turn leaves the conversation)
//	GET    /v1/responses/:id/input_items      the response's input messages
//	POST   /v1/conversations                  create, with items and metadata
//	GET    /v1/conversations/:id              get
//	POST   /v1/conversations/:id              update metadata
//	DELETE /v1/conversations/:id              delete
//	GET    /v1/conversations/:id/items        list items
//	POST   /v1/conversations/:id/items        append items (no reply)
//	GET    /v1/conversations/:id/items/:item  get an item
//	DELETE /v1/conversations/:id/items/:item  delete an item
//
// A conversation is a session: "conv_" + the session id (a bare session id,
// as the chat page shows it, is accepted too), so a conversation started on
// the WebSocket continues here and back. A response id carries its
// session's id; previous_response_id continues that session (and its KV
// cache) when it names the session's newest turn, and forks a copy of the
// history up to it otherwise. instructions is the session's system prompt.
// Supported request fields: input (a string or message items with text
// content), instructions, previous_response_id, conversation, store,
// stream, max_output_tokens, temperature, top_p, metadata, and Parley's own
// sampling fields, and function tools (tools.go).
// Errors are OpenAI's error object (ErrorBody).
package responses

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/oaiwire"
	"github.com/parley-chat/parley/web/internal/wsock"
)

// Conversations is what the Responses and Conversations APIs need from the
// session layer (*session.Service satisfies it). The APIs are mounted when
// the server's Sessions implements it.
type Conversations interface {
	Respond(ctx context.Context, who parley.Caller, req session.ResponseRequest) (*session.Response, error)
	GetResponse(ctx context.Context, who parley.Caller, id string) (session.ResponseRecord, *session.Session, error)
	DeleteResponse(ctx context.Context, who parley.Caller, id string) error
	CreateConversation(ctx context.Context, who parley.Caller, model string, msgs []parley.Message, metadata map[string]string) (*session.Session, error)
	Conversation(ctx context.Context, who parley.Caller, sid string) (*session.Session, error)
	SetMetadata(ctx context.Context, who parley.Caller, sid string, metadata map[string]string) (*session.Session, error)
	DeleteConversation(ctx context.Context, who parley.Caller, sid string) error
	AddItems(ctx context.Context, who parley.Caller, sid string, msgs []parley.Message) (*session.Session, int, error)
	DeleteItem(ctx context.Context, who parley.Caller, sid string, abs int) (*session.Session, error)
	ListConversations(ctx context.Context, who parley.Caller, q session.ListQuery) ([]session.Listing, bool, error)
	Rename(ctx context.Context, who parley.Caller, sid, title string) (*session.Session, error)
	Fork(ctx context.Context, who parley.Caller, sid string, keep int) (*session.Session, error)
}

// API serves the Responses and Conversations APIs over the shared core,
// the server's sockets (the WebSocket mode) and its sessions.
type API struct {
	core    *apicore.Core
	sockets wsock.Lifecycle
	convs   Conversations
	items   itemSessions    // the sessions of recent stored responses, for item_reference inputs (request.go)
	bg      bgRegistry      // background responses (background.go)
	stop    context.Context // the server's: ends when its drain is over, cancelling what still runs
}

// New returns the APIs over core, the server's sockets and convs. stop
// parents every background response.
func New(core *apicore.Core, sockets wsock.Lifecycle, convs Conversations, stop context.Context) *API {
	return &API{core: core, sockets: sockets, convs: convs, stop: stop}
}

// Running is the number of background responses running, which the
// server's drain waits for.
func (s *API) Running() int { return s.bg.running() }

// Wait waits for every background response to end.
func (s *API) Wait() { s.bg.wg.Wait() }

// ErrorBody is err as OpenAI's error body.
func ErrorBody(err error) any { return oaiwire.ErrorBodyOf(err) }

// Limits of the Conversations API.
const (
	maxMetadataKeys     = session.MaxMetadataKeys // OpenAI's limit
	maxMetadataKeyLen   = 64                      // bytes
	maxMetadataValueLen = 512                     // bytes
	maxItemsPerRequest  = 1000
	defaultListLimit    = 20
	maxListLimit        = 100
)

// Wire shapes.

// outputText is a content part: input_text {type, text}, or output_text,
// which always carries annotations and logprobs (empty arrays: Parley makes
// neither) since OpenAI's schema requires them and strict clients (the AI
// SDK) refuse a part without them.
type outputText struct {
	Type        string          `json:"type"` // output_text or input_text
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations,omitempty"` // "[]" on output_text, absent on input_text
	Logprobs    json.RawMessage `json:"logprobs,omitempty"`    // the same
}

// newPart is a content part of type typ holding text.
func newPart(typ, text string) outputText {
	p := outputText{Type: typ, Text: text}
	if typ == "output_text" {
		p.Annotations, p.Logprobs = json.RawMessage("[]"), json.RawMessage("[]")
	}
	return p
}

type messageItem struct {
	Type    string         `json:"type"` // "message", "reasoning", "function_call" or "function_call_output"
	ID      string         `json:"id"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []outputText   `json:"content"`
	tool    toolItemFields // a function item's (see MarshalJSON)
	thought string         // a reasoning item's text
	mcp     any            // an mcp_list_tools, mcp_call or mcp_approval_request item's wire shape (mcpitems.go)
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`          // "response"
	AccessPrograms     *struct{}         `json:"access_programs"` // always null; OpenAI's schema requires the key
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Error              *responseError    `json:"error"`
	IncompleteDetails  *incomplete       `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Model              string            `json:"model"`
	Output             []any             `json:"output"` // a reasoningItem (a reasoning model's thought), then a messageItem
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Conversation       *conversationRef  `json:"conversation"`
	Store              bool              `json:"store"`
	Background         bool              `json:"background,omitempty"`
	Temperature        float64           `json:"temperature"`
	TopP               float64           `json:"top_p"`
	ToolChoice         string            `json:"tool_choice"`
	Tools              []string          `json:"tools"`
	Text               json.RawMessage   `json:"text"`
	Truncation         string            `json:"truncation"`
	Usage              *responsesUsage   `json:"usage"`
	Metadata           map[string]string `json:"metadata"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incomplete struct {
	Reason string `json:"reason"`
}

type conversationRef struct {
	ID string `json:"id"`
}

type deletedObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

type itemList struct {
	Object  string        `json:"object"` // "list"
	Data    []messageItem `json:"data"`
	FirstID *string       `json:"first_id"`
	LastID  *string       `json:"last_id"`
	HasMore bool          `json:"has_more"`
}

func newMessageItem(id string, m parley.Message) messageItem {
	typ, role := "input_text", string(m.Role)
	if m.Role == parley.RoleAssistant {
		typ = "output_text"
	}
	return messageItem{Type: "message", ID: id, Status: "completed", Role: role, Content: []outputText{newPart(typ, m.Content)}}
}

// model is the conversation's (session.Session.Model): "" names the model
// as with one model.
func (s *API) newResponseObject(rec session.ResponseRecord, sid string, stored bool, model string) *responseObject {
	if model == "" {
		model = s.core.ModelName("")
	}
	o := &responseObject{
		ID: rec.ID, Object: "response", CreatedAt: rec.Created, Status: rec.Status, Model: model,
		Output: []any{}, Store: stored, Temperature: rec.Temperature, TopP: rec.TopP,
		ToolChoice: "auto", Tools: []string{}, Text: json.RawMessage(`{"format":{"type":"text"}}`),
		Truncation: "disabled", Metadata: map[string]string{},
	}
	if rec.Instructions != "" {
		o.Instructions = &rec.Instructions
	}
	if rec.MaxTokens > 0 {
		o.MaxOutputTokens = &rec.MaxTokens
	}
	if rec.Previous != "" {
		o.PreviousResponseID = &rec.Previous
	}
	if rec.Status == session.StatusIncomplete {
		o.IncompleteDetails = &incomplete{Reason: "max_output_tokens"}
		if rec.Finish == session.FinishInterrupted { // the server stopped under it (background.go)
			o.IncompleteDetails.Reason = session.FinishInterrupted
		}
	}
	return o
}

func setUsage(o *responseObject, rec session.ResponseRecord) {
	u := &responsesUsage{InputTokens: rec.InputTokens, OutputTokens: rec.OutputTokens, TotalTokens: rec.InputTokens + rec.OutputTokens}
	u.InputTokensDetails.CachedTokens = rec.CachedTokens
	u.OutputTokensDetails.ReasoningTokens = rec.ReasoningTokens
	o.Usage = u
}

// CreateResponse is POST /v1/responses.
func (s *API) CreateResponse(c echo.Context) error {
	if err := s.core.Available(); err != nil {
		return err
	}
	body, err := apicore.ReadBody(c)
	if err != nil {
		return err
	}
	pr, err := s.parseResponsesRequest(c.Request().Context(), apicore.FactsOf(c), body)
	if err != nil {
		return err
	}
	if pr.bg {
		return s.startBackground(c, pr)
	}
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	if err := s.prepareMCP(ctx, pr); err != nil {
		return err
	}
	resp, err := s.respond(ctx, pr.facts.Caller, pr.req)
	if err != nil {
		return pr.renameSent(err)
	}
	setAffinity(c, pr, resp)
	if pr.mcp != nil {
		return s.answerMCP(c, ctx, cancel, resp, pr)
	}
	if !pr.stream {
		meter := s.core.Meter(pr.facts.Model)
		for ev := range resp.Events() {
			meter.Observe(ev)
			if ev.Done {
				apicore.ReplyLog(s.core.Log.With(zap.String("route", "responses")), ev)
				if ev.Finish == parley.FinishError {
					return pr.renameSent(apicore.ErrOr(ev.Err))
				}
			}
		}
		return c.JSON(http.StatusOK, s.finishedResponse(resp, pr))
	}
	w := s.core.BeginStream(c, "text/event-stream")
	emit := func(typ string, b []byte) error {
		return w.Write([]byte("event: " + typ + "\ndata: " + string(b) + "\n\n"))
	}
	return s.streamResponse(ctx, cancel, resp, pr, emit)
}

// finishedResponse is the response object of a turn whose events are done.
func (s *API) finishedResponse(resp *session.Response, pr *parsedResponse) *responseObject {
	rec := resp.Final()
	o := s.newResponseObject(rec, resp.SessionID(), resp.Stored, resp.Model)
	for _, it := range replyItems(resp.SessionID(), resp.Record.End, rec.Status,
		parley.Message{Role: parley.RoleAssistant, Content: resp.Text(), Reasoning: resp.Reasoning(), ToolCalls: resp.ToolCalls()}, nil) {
		o.Output = append(o.Output, it)
	}
	pr.echo(o, resp.SessionID())
	setUsage(o, rec)
	return o
}

// echo sets on o, a response of session sid, what it repeats of the
// request: the conversation, the metadata and the text configuration.
func (pr *parsedResponse) echo(o *responseObject, sid string) {
	if pr.conv != "" {
		o.Conversation = &conversationRef{ID: session.ConversationID(sid)}
	}
	if pr.meta != nil {
		o.Metadata = pr.meta
	}
	if pr.text != nil {
		o.Text = pr.text
	}
}

func (s *API) outputItem(resp *session.Response, status, text string) messageItem {
	return replyItem(resp.SessionID(), resp.Record.End, status, parley.Message{Role: parley.RoleAssistant, Content: text})
}

// replyItem is the output item of a response that ends at position end of
// session sid: its reply m, "incomplete" unless status is completed.
func replyItem(sid string, end int, status string, m parley.Message) messageItem {
	it := newMessageItem(session.ItemID(sid, end-1), m)
	if status != session.StatusCompleted {
		it.Status = "incomplete"
	}
	return it
}

// GetResponse is GET /v1/responses/:id.
func (s *API) GetResponse(c echo.Context) error {
	if ok, err := s.getBackground(c); ok {
		return err
	}
	rec, sess, err := s.convs.GetResponse(c.Request().Context(), apicore.FactsOf(c).Caller, c.Param("id"))
	if err != nil {
		return err
	}
	o := s.newResponseObject(rec, sess.ID, true, sess.Model)
	for _, it := range storedOutput(sess, rec) {
		o.Output = append(o.Output, it)
	}
	setUsage(o, rec)
	return c.JSON(http.StatusOK, o)
}

// DeleteResponse is DELETE /v1/responses/:id.
func (s *API) DeleteResponse(c echo.Context) error {
	id := c.Param("id")
	if err := s.convs.DeleteResponse(c.Request().Context(), apicore.FactsOf(c).Caller, id); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, deletedObject{ID: id, Object: "response.deleted", Deleted: true})
}

// InputItems is GET /v1/responses/:id/input_items.
func (s *API) InputItems(c echo.Context) error {
	rec, sess, err := s.convs.GetResponse(c.Request().Context(), apicore.FactsOf(c).Caller, c.Param("id"))
	if err != nil {
		return err
	}
	var items []messageItem
	sc := newServerCalls(sess.Messages)
	stepsAt := rec.End - 1 - rec.Steps
	at, lists := listsAt(sess, rec, sc), storedListItems(rec)
	for i, m := range sess.Span(rec.Start, stepsAt) {
		if rec.Start+i == at {
			items = append(items, lists...) // before the calls the request's approvals made, as its output showed them
		}
		items = append(items, itemsOf(sess.ID, rec.Start+i, m, sc)...)
	}
	return listItems(c, items)
}

// listItems pages items (oldest first) by the query's order (default
// desc), after and limit.
func listItems(c echo.Context, items []messageItem) error {
	q := c.QueryParams()
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return parley.FieldErrorf("limit", "must be an integer from 1 to %d", maxListLimit)
		}
		limit = n
	}
	switch q.Get("order") {
	case "", "desc":
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	case "asc":
	default:
		return parley.FieldErrorf("order", "must be asc or desc")
	}
	if after := q.Get("after"); after != "" {
		for i, it := range items {
			if it.ID == after {
				items = items[i+1:]
				break
			}
		}
	}
	l := itemList{Object: "list", Data: []messageItem{}}
	if len(items) > limit {
		items, l.HasMore = items[:limit], true
	}
	l.Data = append(l.Data, items...)
	if len(items) > 0 {
		l.FirstID, l.LastID = &items[0].ID, &items[len(items)-1].ID
	}
	return c.JSON(http.StatusOK, l)
}
