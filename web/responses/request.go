package responses

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// A Responses request: its body decoded and validated once, its input
// items turned into a conversation, and the item references it makes
// resolved against the sessions of recent stored responses.

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
	// Generate false is the WebSocket mode's warm-up (socket.go).
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
	// function_call and function_call_output items (tools.go)
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	// ID is an item_reference's item (resolveItem); other items'
	// ids are ignored.
	ID string `json:"id"`
	// mcp_approval_response items, and mcp_call and mcp_approval_request
	// items a client sends back (mcp.go)
	ApprovalRequestID string  `json:"approval_request_id"`
	Approve           *bool   `json:"approve"`
	ServerLabel       string  `json:"server_label"`
	Error             *string `json:"error"`
}

// parsedResponse is a decoded, validated create request.
type parsedResponse struct {
	req    session.ResponseRequest
	typ    string // the request's "type" ("response.create" on the WebSocket)
	stream bool
	bg     bool   // background: true (background.go)
	warmup bool   // generate: false (the WebSocket mode's warm-up)
	conv   string // the conversation id as given, "" without one
	meta   map[string]string
	text   json.RawMessage // the request's text configuration, echoed in the response; nil: the default
	// renameSent names the field the client sent in an error from the engine.
	renameSent func(error) error
	// mcp is the request's server tools and approvals (mcp.go); nil without.
	mcp *mcpRequest
	// facts are the request's: its scope, its prompt_cache_key
	// (affinity.go) and the model it picked ("" with one model; a stored
	// conversation keeps its own).
	facts apicore.Facts
}

// parseResponsesRequest decodes a create request whose edge facts (its
// caller and scope: apicore.FactsOf) are facts.
func (s *API) parseResponsesRequest(ctx context.Context, facts apicore.Facts, body []byte) (*parsedResponse, error) {
	return s.parseRequest(ctx, facts, body, nil)
}

// parseRequest is parseResponsesRequest with checkRest, when not nil, given
// the bytes of the request's images as it carried them once its input is
// parsed, before its prompt is counted: the WebSocket mode's check that a
// message past its cap is past it only by its images.
func (s *API) parseRequest(ctx context.Context, facts apicore.Facts, body []byte, checkRest func(imageBytes int64) error) (*parsedResponse, error) {
	var req responsesRequest
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return nil, err
	}
	model, err := s.core.ResolveModel(req.Model)
	if err != nil {
		return nil, err
	}
	facts.Model = model
	if err := req.CacheKeyFields.Narrow(&facts); err != nil {
		return nil, err
	}
	// A request that continues no stored history brings it in its input,
	// server calls included (mcp_call and mcp_approval_request items); one
	// that continues a response or conversation has them stored.
	stateless := req.PreviousResponseID == nil && !apicore.IsSet(req.Conversation)
	images := s.core.Images(ctx)
	msgs, err := parseInput(req.Input, "input", func(id, field string) (itemRef, error) { return s.resolveItem(ctx, facts.Caller, id, field) }, images, stateless)
	if err != nil {
		return nil, err
	}
	if checkRest != nil {
		if err := checkRest(images.SourceBytes()); err != nil {
			return nil, err
		}
	}
	mreq, err := parseMCPRequest(req.Tools, req.Input)
	if err != nil {
		return nil, err
	}
	if mreq != nil && req.Background {
		return nil, parley.FieldErrorf("background", "cannot be used with mcp tools")
	}
	// A request that continues a WebSocket warm-up may bring no input of its
	// own: the warm-up's is prepended (warmup.chain). One that answers
	// approval requests may bring only those: their results are its input.
	continuesWarmup := req.PreviousResponseID != nil && strings.HasPrefix(*req.PreviousResponseID, warmupPrefix)
	approvals := mreq != nil && len(mreq.approvals) > 0
	if len(msgs) == 0 && !continuesWarmup && !approvals {
		return nil, parley.FieldErrorf("input", "is required")
	}
	// An answer's results come after the call they answer (prepareMCP); the
	// turn's input is checked again with them (session.Respond).
	if err := session.CheckResponseInput(msgs); err != nil && !continuesWarmup && !approvals {
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
	// A request that continues no conversation brings its whole prompt:
	// as a chat completion's, the responder holds the rendered prompt to
	// the cap as it tokenizes it (session.ResponseRequest.MaxPromptTokens),
	// so it is tokenized once; here only its messages are counted, and its
	// text only when it is far over the cap (apicore.CountedPromptText). A
	// turn of a conversation counts its new input here: the history is not
	// the request's. One with server tools counts here too, as the tools'
	// definitions are the servers', not the request's.
	whole := req.PreviousResponseID == nil && !apicore.IsSet(req.Conversation) && mreq == nil
	if whole {
		text = apicore.CountedPromptText(text, parley.ImageCount(msgs) > 0, s.core.MaxPromptTokens)
	}
	if err := s.core.CountPromptTokens(ctx, model, text, len(msgs), true); err != nil {
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
	p, err := s.core.ResolveParams(&req.ParamsPatch, func(p *parley.Params) (err error) {
		if p.Tools, err = parseResponsesTools(req.Tools); err != nil {
			return err
		}
		p.ToolChoice, err = apicore.ParseToolChoice(req.ToolChoice, "tool_choice")
		return err
	})
	if err != nil {
		if req.MaxOutputTokens != nil {
			err = apicore.RenameField(err, "max_tokens", "max_output_tokens") // the field the client sent
		}
		return nil, err
	}
	apicore.ResolveSeed(&p)
	out := &parsedResponse{facts: facts, typ: req.Type, stream: req.Stream, bg: req.Background, meta: req.Metadata, text: textConfig,
		warmup:     req.Generate != nil && !*req.Generate,
		renameSent: req.ParamsPatch.RenameSent, mcp: mreq,
		req: session.ResponseRequest{Input: msgs, Instructions: req.Instructions, Params: p, Model: model,
			NoStore: req.Store != nil && !*req.Store, Scope: facts.Scope}}
	if whole && s.core.MaxPromptTokens > 0 && s.core.Tokenizer != nil {
		out.req.MaxPromptTokens = s.core.MaxPromptTokens
	}
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

// parseInput decodes a string (one user message) or an array of message
// items. With serverCalls, mcp_call and mcp_approval_request items become
// the messages a session stores for them (mcpInputMessages); else they are
// skipped, as mcp_list_tools and mcp_approval_response items always are.
func parseInput(raw json.RawMessage, field string, refs func(id, field string) (itemRef, error), images *apicore.ImageBatch, serverCalls bool) ([]parley.Message, error) {
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
		if mcpItem(it.Type) {
			if serverCalls {
				m, err := mcpInputMessages(it, f, msgs)
				if err != nil {
					return nil, err
				}
				msgs = append(msgs, m...)
			}
			continue // read by parseMCPRequest, or an output item a client sends back (mcp.go)
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
		} else if m, err = parseItem(it, f, images); err != nil {
			return nil, err
		}
		if m.Role == parley.RoleAssistant {
			m.Reasoning, thought = thought, ""
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// parseItem takes one input item; a user's message may hold input_image parts when images is not nil.
func parseItem(it inputItem, field string, images *apicore.ImageBatch) (parley.Message, error) {
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
	var imageTypes []string
	if images != nil && role == parley.RoleUser {
		imageTypes = []string{"input_image"}
	}
	text, imgs, err := apicore.ParseContentParts(it.Content, field+".content", images, []string{"input_text", "output_text", "text"}, imageTypes...)
	if err != nil {
		return parley.Message{}, err
	}
	if len(imgs) == 0 {
		if err := apicore.CheckNotEmpty(role, text, field+".content"); err != nil {
			return parley.Message{}, err
		}
	}
	return parley.Message{Role: role, Content: text, Images: imgs}, nil
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

// item_reference inputs: a client that keeps its own history but lets the
// server store the responses (the AI SDK's OpenAI provider, store: true)
// sends an earlier output item back as {"type": "item_reference", "id":
// ...} instead of its content. Item ids name their session through a
// one-way digest (session.ItemID), so the server remembers which session
// each recent stored response's items belong to, and reads the item from
// that session when a later request refers to it.

// maxItemSessions bounds the sessions itemSessions remembers: the newest
// stored responses' sessions. A reference to an item of an older one is a
// 404, as a reference to an item OpenAI no longer keeps is.
const maxItemSessions = 4096

// itemSessions maps the session digest in item ids (session.ItemID without
// its prefix and position) to the session id, for the newest
// maxItemSessions sessions that stored a response. Safe for concurrent use.
type itemSessions struct {
	mu    sync.Mutex
	sids  map[string]string
	order []string // keys, oldest first
}

// itemKeyOf is the session digest in session sid's item ids.
func itemKeyOf(sid string) string {
	id := session.ItemID(sid, 0)
	return strings.TrimSuffix(strings.TrimPrefix(id, session.ItemPrefix), "0")
}

func (r *itemSessions) remember(sid string) {
	key := itemKeyOf(sid)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sids == nil {
		r.sids = map[string]string{}
	}
	if _, ok := r.sids[key]; ok {
		return
	}
	r.sids[key] = sid
	r.order = append(r.order, key)
	if len(r.order) > maxItemSessions {
		delete(r.sids, r.order[0])
		r.order = r.order[1:]
	}
}

// find returns the session whose digest begins rest (an item id without its
// prefix), and what follows the digest. Every digest has one length.
func (r *itemSessions) find(rest string) (sid, tail string, ok bool) {
	n := len(itemKeyOf(""))
	if len(rest) <= n {
		return "", "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sid, ok = r.sids[rest[:n]]
	return sid, rest[n:], ok
}

// respond runs a Responses turn and remembers its session for later
// item_reference inputs when the response is stored. Every Responses turn
// (HTTP, background, WebSocket) starts here.
func (s *API) respond(ctx context.Context, who parley.Caller, req session.ResponseRequest) (*session.Response, error) {
	if strings.HasPrefix(req.Previous, warmupPrefix) {
		// A warm-up is kept by its socket alone (warmup.chain took those it knows).
		return nil, parley.Errorf(parley.ENotFound, "no such response: a warm-up (generate: false) continues only on its own WebSocket")
	}
	resp, err := s.convs.Respond(ctx, who, req)
	if err == nil && resp.Stored {
		s.items.remember(resp.SessionID())
	}
	return resp, err
}

// itemRef is a resolved item_reference: a message (a message item's text,
// or a function_call item's call) or a reasoning item's thought.
type itemRef struct {
	msg     parley.Message
	thought string
	isMsg   bool
}

// resolveItem reads the item an item_reference names (field names the
// reference): a message item (msg_), a function call (fc_) or a reasoning
// item (rs_) of a stored response.
func (s *API) resolveItem(ctx context.Context, who parley.Caller, id, field string) (itemRef, error) {
	notFound := parley.FieldErrorf(field+".id", "no stored item %q (an item_reference names an output item of a stored response this server still keeps)", id)
	if s.convs == nil {
		return itemRef{}, notFound
	}
	prefix, rest, ok := strings.Cut(id, "_")
	if !ok {
		return itemRef{}, notFound
	}
	sid, tail, ok := s.items.find(rest)
	if !ok {
		return itemRef{}, notFound
	}
	call := -1
	if prefix == "fc" {
		pos, j, ok := strings.Cut(tail, "_")
		n, err := strconv.Atoi(j)
		if !ok || err != nil || n < 0 {
			return itemRef{}, notFound
		}
		tail, call = pos, n
	}
	abs, err := strconv.Atoi(tail)
	if err != nil || abs < 0 || strconv.Itoa(abs) != tail {
		return itemRef{}, notFound
	}
	sess, err := s.convs.Conversation(ctx, who, sid)
	if err != nil {
		return itemRef{}, notFound
	}
	span := sess.Span(abs, abs+1)
	if len(span) != 1 {
		return itemRef{}, notFound
	}
	m := span[0]
	switch prefix {
	case "msg":
		return itemRef{msg: parley.Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}, isMsg: true}, nil
	case "rs":
		return itemRef{thought: m.Reasoning}, nil
	case "fc":
		if call < len(m.ToolCalls) {
			return itemRef{msg: parley.Message{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{m.ToolCalls[call]}}, isMsg: true}, nil
		}
	}
	return itemRef{}, notFound
}
