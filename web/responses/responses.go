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
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

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
	Respond(ctx context.Context, req session.ResponseRequest) (*session.Response, error)
	GetResponse(ctx context.Context, id string) (session.ResponseRecord, *session.Session, error)
	DeleteResponse(ctx context.Context, id string) error
	CreateConversation(ctx context.Context, msgs []parley.Message, metadata map[string]string) (*session.Session, error)
	Conversation(ctx context.Context, sid string) (*session.Session, error)
	SetMetadata(ctx context.Context, sid string, metadata map[string]string) (*session.Session, error)
	DeleteConversation(ctx context.Context, sid string) error
	AddItems(ctx context.Context, sid string, msgs []parley.Message) (*session.Session, int, error)
	DeleteItem(ctx context.Context, sid string, abs int) (*session.Session, error)
	ListConversations(ctx context.Context, q session.ListQuery) ([]session.Listing, bool, error)
	Rename(ctx context.Context, sid, title string) (*session.Session, error)
	Fork(ctx context.Context, sid string, keep int) (*session.Session, error)
}

// API serves the Responses and Conversations APIs over the shared core,
// the server's sockets (the WebSocket mode) and its sessions.
type API struct {
	core    *apicore.Core
	sockets wsock.Lifecycle
	convs   Conversations
	items   itemSessions    // the sessions of recent stored responses, for item_reference inputs (refs.go)
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

// responsesRequest is the body of POST /v1/responses and of a WebSocket
// "response.create" message.
type responsesRequest struct {
	apicore.ParamsPatch
	apicore.CacheKeyFields
	Type               string            `json:"type"` // "response.create" on the WebSocket
	Model              string            `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	Store              *bool             `json:"store"`
	Stream             bool              `json:"stream"`
	Background         bool              `json:"background"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Conversation       json.RawMessage   `json:"conversation"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Metadata           map[string]string `json:"metadata"`
	Tools              json.RawMessage   `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"` // accepted; a reply makes at most one call
	Text               *responseText     `json:"text"`
	// Reasoning.Effort switches a reasoning model's thought: "none" off, any effort on (see thinkPatch).
	Reasoning *struct {
		Effort *string `json:"effort"`
	} `json:"reasoning"`
	// Generate false is the WebSocket mode's warm-up (api_responses_ws.go).
	Generate *bool `json:"generate"`
}

// responseText is the request's (and the response's) text configuration:
// its format is text, json_object, or json_schema with the schema that
// constrains the reply (structured output).
type responseText struct {
	Format *struct {
		Type   string          `json:"type"`
		Name   string          `json:"name,omitempty"`
		Schema json.RawMessage `json:"schema,omitempty"`
		Strict *bool           `json:"strict,omitempty"`
	} `json:"format"`
}

// inputItem is one item of an input array or of a conversation.
type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// function_call and function_call_output items (api_responses_tools.go)
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	// ID is an item_reference's item (api_responses_refs.go); other items'
	// ids are ignored.
	ID string `json:"id"`
}

// parsedResponse is a decoded, validated create request.
type parsedResponse struct {
	req    session.ResponseRequest
	typ    string // the request's "type" ("response.create" on the WebSocket)
	stream bool
	bg     bool   // background: true (api_responses_bg.go)
	warmup bool   // generate: false (the WebSocket mode's warm-up)
	conv   string // the conversation id as given, "" without one
	model  string // the model the request picked ("" with one model); a stored conversation keeps its own
	meta   map[string]string
	text   json.RawMessage // the request's text configuration, echoed in the response; nil: the default
	// renameSent names the field the client sent in an error from the engine.
	renameSent func(error) error
	// scope is the request's cache scope, narrowed by its prompt_cache_key
	// or cache_salt (see turnContext).
	scope string
}

// turnContext is ctx for the turn pr asks for: its cache scope, and an
// unstored turn's KV state kept no longer than its slot (it belongs to no
// stored session).
func (pr *parsedResponse) turnContext(ctx context.Context) context.Context {
	ctx = parley.WithCacheScope(ctx, pr.scope)
	if pr.req.NoStore || pr.req.Local != nil {
		ctx = parley.WithStateless(ctx)
	}
	return ctx
}

func (s *API) parseResponsesRequest(ctx context.Context, body []byte) (*parsedResponse, error) {
	var req responsesRequest
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return nil, err
	}
	model, err := s.core.ResolveModel(req.Model)
	if err != nil {
		return nil, err
	}
	ctx = apicore.WithModel(ctx, model)
	if ctx, err = req.CacheKeyFields.Narrow(ctx); err != nil {
		return nil, err
	}
	msgs, err := parseInput(req.Input, "input", func(id, field string) (itemRef, error) { return s.resolveItem(ctx, id, field) })
	if err != nil {
		return nil, err
	}
	// A request that continues a WebSocket warm-up may bring no input of its
	// own: the warm-up's is prepended (warmup.chain).
	continuesWarmup := req.PreviousResponseID != nil && strings.HasPrefix(*req.PreviousResponseID, warmupPrefix)
	if len(msgs) == 0 && !continuesWarmup {
		return nil, parley.FieldErrorf("input", "is required")
	}
	if err := session.CheckResponseInput(msgs); err != nil && !continuesWarmup {
		return nil, err
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, err
	}
	// Every string of the input and the tools counts (the tools as their
	// JSON text), and one token per message for its role marker.
	text := apicore.PromptText(msgs, nil) + string(req.Tools)
	if req.Instructions != nil {
		text += *req.Instructions
	}
	if err := s.core.CountPromptTokens(ctx, text, len(msgs), true); err != nil {
		return nil, err
	}
	if req.Reasoning != nil && req.Reasoning.Effort != nil {
		req.ParamsPatch.ReasoningEffort = req.Reasoning.Effort
	}
	if req.MaxOutputTokens != nil {
		req.ParamsPatch.MaxTokens = req.MaxOutputTokens
	}
	var textConfig json.RawMessage
	if req.Text != nil && req.Text.Format != nil {
		switch f := req.Text.Format; f.Type {
		case "", "text":
		case "json_object":
			req.ParamsPatch.JSONSchema = json.RawMessage(`{"type":"object"}`)
			req.ParamsPatch.SchemaField = "text.format"
		case "json_schema":
			if !apicore.IsSet(f.Schema) {
				return nil, parley.FieldErrorf("text.format.schema", "is required")
			}
			req.ParamsPatch.JSONSchema = f.Schema
			req.ParamsPatch.SchemaField = "text.format.schema"
		default:
			return nil, parley.FieldErrorf("text.format.type", "must be text, json_object or json_schema, got %q", f.Type)
		}
		if textConfig, err = json.Marshal(req.Text); err != nil {
			return nil, fmt.Errorf("encode text: %w", err)
		}
	}
	p, err := s.core.ResolveParams(&req.ParamsPatch)
	if err != nil {
		if req.MaxOutputTokens != nil {
			err = apicore.RenameField(err, "max_tokens", "max_output_tokens") // the field the client sent
		}
		return nil, err
	}
	if p.Tools, err = parseResponsesTools(req.Tools); err != nil {
		return nil, err
	}
	if p.ToolChoice, err = apicore.ParseToolChoice(req.ToolChoice, "tool_choice"); err != nil {
		return nil, err
	}
	if err := p.Validate(s.core.MaxTokensCap); err != nil {
		return nil, err
	}
	apicore.ResolveSeed(&p)
	out := &parsedResponse{model: model, typ: req.Type, stream: req.Stream, bg: req.Background, meta: req.Metadata, text: textConfig,
		warmup:     req.Generate != nil && !*req.Generate,
		renameSent: req.ParamsPatch.RenameSent, scope: parley.CacheScope(ctx),
		req: session.ResponseRequest{Input: msgs, Instructions: req.Instructions, Params: p,
			NoStore: req.Store != nil && !*req.Store}}
	if req.PreviousResponseID != nil {
		out.req.Previous = *req.PreviousResponseID
		if out.req.Previous == "" {
			return nil, parley.FieldErrorf("previous_response_id", "must not be empty")
		}
	}
	if apicore.IsSet(req.Conversation) {
		conv, err := parseConversationField(req.Conversation)
		if err != nil {
			return nil, err
		}
		out.conv = conv
		out.req.Conversation = conv
	}
	if err := session.CheckResponseContinuation(out.req.Previous, out.req.Conversation); err != nil {
		return nil, err
	}
	return out, nil
}

// parseConversationField reads a create request's conversation field:
// "conv_..." or {"id": "conv_..."}.
func parseConversationField(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	var id string
	if len(raw) > 0 && raw[0] == '{' {
		var obj struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", parley.FieldErrorf("conversation", "must be a conversation id or {\"id\": ...}")
		}
		id = obj.ID
	} else if err := json.Unmarshal(raw, &id); err != nil {
		return "", parley.FieldErrorf("conversation", "must be a conversation id or {\"id\": ...}")
	}
	if id == "" {
		return "", parley.FieldErrorf("conversation", "must not be empty")
	}
	return id, nil
}

// parseInput decodes a string (one user message) or an array of message items.
func parseInput(raw json.RawMessage, field string, refs func(id, field string) (itemRef, error)) ([]parley.Message, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, parley.FieldErrorf(field, "invalid string: %v", err)
		}
		if s == "" {
			return nil, parley.FieldErrorf(field, "must not be empty")
		}
		return []parley.Message{{Role: parley.RoleUser, Content: s}}, nil
	}
	var items []inputItem
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, parley.FieldErrorf(field, "must be a string or an array of message items")
	}
	if len(items) > maxItemsPerRequest {
		return nil, parley.FieldErrorf(field, "at most %d items", maxItemsPerRequest)
	}
	msgs := make([]parley.Message, 0, len(items))
	thought := "" // a reasoning item's text, for the assistant message after it
	for i, it := range items {
		f := fmt.Sprintf("%s[%d]", field, i)
		if it.Type == "reasoning" {
			t, err := reasoningInput(it, f)
			if err != nil {
				return nil, err
			}
			thought = t
			continue
		}
		var m parley.Message
		var err error
		if it.Type == "item_reference" {
			if refs == nil {
				return nil, parley.FieldErrorf(f+".type", "item_reference is for responses' input")
			}
			ref, err := refs(it.ID, f)
			if err != nil {
				return nil, err
			}
			if !ref.isMsg {
				thought = ref.thought
				continue
			}
			m = ref.msg
		} else if m, err = parseItem(it, f); err != nil {
			return nil, err
		}
		if m.Role == parley.RoleAssistant {
			m.Reasoning, thought = thought, ""
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func parseItem(it inputItem, field string) (parley.Message, error) {
	switch it.Type {
	case "", "message":
	case "function_call", "function_call_output":
		return parseToolItem(it, field)
	default:
		return parley.Message{}, parley.FieldErrorf(field+".type", "must be message, function_call, function_call_output, reasoning or item_reference, got %q", it.Type)
	}
	role, err := apicore.ParseRole(it.Role, field+".role")
	if err != nil {
		return parley.Message{}, err
	}
	text, err := apicore.ParseContent(it.Content, field+".content", "input_text", "output_text", "text")
	if err != nil {
		return parley.Message{}, err
	}
	if err := apicore.CheckNotEmpty(role, text, field+".content"); err != nil {
		return parley.Message{}, err
	}
	return parley.Message{Role: role, Content: text}, nil
}

func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataKeys {
		return parley.FieldErrorf("metadata", "at most %d keys", maxMetadataKeys)
	}
	for k, v := range m {
		if len(k) > maxMetadataKeyLen || len(v) > maxMetadataValueLen {
			return parley.FieldErrorf("metadata", "keys are at most %d bytes and values %d", maxMetadataKeyLen, maxMetadataValueLen)
		}
	}
	return nil
}

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
		model = s.core.ModelName(context.Background())
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
		if rec.Finish == session.FinishInterrupted { // the server stopped under it (api_responses_bg.go)
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
	pr, err := s.parseResponsesRequest(c.Request().Context(), body)
	if err != nil {
		return err
	}
	if pr.bg {
		return s.startBackground(c, pr)
	}
	ctx, cancel := context.WithCancel(apicore.WithModel(pr.turnContext(c.Request().Context()), pr.model))
	defer cancel()
	resp, err := s.respond(ctx, pr.req)
	if err != nil {
		return pr.renameSent(err)
	}
	if !pr.stream {
		meter := s.core.Meter(parley.ModelFrom(ctx))
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
		parley.Message{Role: parley.RoleAssistant, Content: resp.Text(), Reasoning: resp.Reasoning(), ToolCalls: resp.ToolCalls()}) {
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
	rec, sess, err := s.convs.GetResponse(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	o := s.newResponseObject(rec, sess.ID, true, sess.Model)
	out := sess.Span(rec.End-1, rec.End)
	if len(out) == 1 {
		for _, it := range replyItems(sess.ID, rec.End, rec.Status, out[0]) {
			o.Output = append(o.Output, it)
		}
	}
	setUsage(o, rec)
	return c.JSON(http.StatusOK, o)
}

// DeleteResponse is DELETE /v1/responses/:id.
func (s *API) DeleteResponse(c echo.Context) error {
	id := c.Param("id")
	if err := s.convs.DeleteResponse(c.Request().Context(), id); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, deletedObject{ID: id, Object: "response.deleted", Deleted: true})
}

// InputItems is GET /v1/responses/:id/input_items.
func (s *API) InputItems(c echo.Context) error {
	rec, sess, err := s.convs.GetResponse(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	var items []messageItem
	for i, m := range sess.Span(rec.Start, rec.End-1) {
		items = append(items, itemsOf(sess.ID, rec.Start+i, m)...)
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
