package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// maxAnthropicBlocks bounds the content blocks of one request (system and
// every message together; a string content counts as one block). Each block costs a little to parse and render; a
// conversation past this many is far beyond any context window the engine
// serves, so this refuses only bodies built to be expensive.
const maxAnthropicBlocks = 4096

// billingHeaderPrefix starts the system block Claude Code sends first in
// every request: a per-request billing tag (its cch= hash changes every
// time) with no meaning to the model. Left in, it would make the prompt's
// first tokens differ on every request, so no turn could reuse the KV cache
// of the one before; Parley drops it (stripVolatileSystem).
const billingHeaderPrefix = "x-anthropic-billing-header:"

// anthropicBlock is one content block of a request; which fields apply
// depends on Type.
type anthropicBlock struct {
	Type     string  `json:"type"`
	Text     *string `json:"text"`
	Thinking *string `json:"thinking"` // of a thinking block
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicRequest struct {
	apicore.ParamsPatch
	Model      string             `json:"model"`
	System     json.RawMessage    `json:"system"`
	Messages   []anthropicMessage `json:"messages"`
	Stream     bool               `json:"stream"`
	Metadata   json.RawMessage    `json:"metadata"`
	Tools      json.RawMessage    `json:"tools"`
	ToolChoice json.RawMessage    `json:"tool_choice"`
	Thinking   *anthropicThinking `json:"thinking"`
	// OutputConfig.Format is structured output: {"type": "json_schema",
	// "schema": {...}} constrains the reply's text to JSON that validates, as
	// OpenAI's response_format does. OutputFormat is the same in the form of
	// the structured-outputs beta, which older SDKs send.
	OutputConfig *struct {
		Format *anthropicFormat `json:"format"`
	} `json:"output_config"`
	OutputFormat *anthropicFormat `json:"output_format"`
}

// anthropicFormat is a structured-output format.
type anthropicFormat struct {
	Type   string          `json:"type"`
	Schema json.RawMessage `json:"schema"`
}

// apply puts the format's schema on patch; field names where it was sent.
func (f *anthropicFormat) apply(patch *apicore.ParamsPatch, field string) error {
	if f == nil {
		return nil
	}
	if f.Type != "json_schema" {
		return parley.FieldErrorf(field+".type", "must be json_schema, got %q", f.Type)
	}
	if !apicore.IsSet(f.Schema) {
		return parley.FieldErrorf(field+".schema", "is required")
	}
	patch.JSONSchema = f.Schema
	patch.SchemaField = field + ".schema"
	return nil
}

// anthropicThinking is a request's thinking: {"type": "enabled",
// "budget_tokens": N}, {"type": "disabled"} or {"type": "adaptive"}.
type anthropicThinking struct {
	Type         string `json:"type"`
	BudgetTokens *int   `json:"budget_tokens"`
}

// apply sets p's switch and budget for a reasoning model's thought.
func (t *anthropicThinking) apply(p *parley.Params) error {
	if t == nil {
		return nil
	}
	on, off := true, false
	switch t.Type {
	case "enabled":
		p.Think = &on
		if t.BudgetTokens != nil {
			if *t.BudgetTokens < 1 {
				return parley.FieldErrorf("thinking.budget_tokens", "must be at least 1, got %d", *t.BudgetTokens)
			}
			p.ThinkBudget = *t.BudgetTokens
		}
	case "disabled":
		p.Think = &off
	case "adaptive":
	default:
		return parley.FieldErrorf("thinking.type", "must be enabled, disabled or adaptive, got %q", t.Type)
	}
	return nil
}

// anthropicCall is a decoded, validated Messages request.
type anthropicCall struct {
	facts  apicore.Facts
	key    string // the conversation's KV-cache key (anthropicKey)
	msgs   []parley.Message
	params parley.Params
	stream bool
	stops  []string // stop_sequences as sent: a match among them is stop_reason "stop_sequence"
	patch  *apicore.ParamsPatch
}

// blockCounter counts a request's content blocks against maxAnthropicBlocks.
type blockCounter int

func (n *blockCounter) add(k int, field string) error {
	*n += blockCounter(k)
	if *n > maxAnthropicBlocks {
		return parley.FieldErrorf(field, "too many content blocks: a request may hold at most %d in all", maxAnthropicBlocks)
	}
	return nil
}

// parseAnthropicBody decodes a Messages (or count_tokens) request body.
// count is true for count_tokens, which needs no max_tokens.
func (s *API) parseAnthropicBody(c echo.Context, count bool) (*anthropicCall, error) {
	body, err := apicore.ReadBody(c)
	if err != nil {
		return nil, err
	}
	var req anthropicRequest
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return nil, err
	}
	facts := apicore.FactsOf(c)
	if facts.Model, err = s.core.ResolveModel(req.Model); err != nil {
		return nil, err
	}
	if !count && req.MaxTokens == nil {
		return nil, parley.FieldErrorf("max_tokens", "is required")
	}
	if req.MaxTokens != nil {
		*req.MaxTokens = s.clampAnthropicMaxTokens(*req.MaxTokens)
	}
	if err := checkAnthropicMetadata(req.Metadata); err != nil {
		return nil, err
	}
	var blocks blockCounter
	var msgs []parley.Message
	system, err := parseAnthropicSystem(req.System, &blocks)
	if err != nil {
		return nil, err
	}
	if system != "" {
		msgs = append(msgs, parley.Message{Role: parley.RoleSystem, Content: system})
	}
	if len(req.Messages) == 0 {
		return nil, parley.FieldErrorf("messages", "at least one message is required")
	}
	ids := map[string]string{} // tool_use ids seen, and their tools' names
	images := s.core.Images(c.Request().Context())
	for i, m := range req.Messages {
		ms, err := parseAnthropicMessage(m, fmt.Sprintf("messages[%d]", i), &blocks, ids, images)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, ms...)
	}
	if err := checkAnthropicLast(req.Messages, msgs); err != nil {
		return nil, err
	}
	if req.OutputConfig != nil {
		if err := req.OutputConfig.Format.apply(&req.ParamsPatch, "output_config.format"); err != nil {
			return nil, err
		}
	}
	if err := req.OutputFormat.apply(&req.ParamsPatch, "output_format"); err != nil {
		return nil, err
	}
	call := &anthropicCall{facts: facts, key: anthropicKey(msgs), msgs: msgs, stream: req.Stream, patch: &req.ParamsPatch}
	call.stops = append(append([]string(nil), req.Stop...), req.StopSequences...)
	patch := &req.ParamsPatch
	if count {
		patch = nil // counting needs no reply parameters: the defaults stand in
	}
	p, err := s.core.ResolveParams(patch, func(p *parley.Params) (err error) {
		if err := req.Thinking.apply(p); err != nil {
			return err
		}
		if p.Tools, err = parseAnthropicTools(req.Tools); err != nil {
			return err
		}
		p.ToolChoice, err = parseAnthropicToolChoice(req.ToolChoice)
		return err
	})
	if err != nil {
		return nil, renameToolField(renameThinkField(err))
	}
	apicore.ResolveSeed(&p)
	p.SkipLogprobs = true
	call.params = p
	return call, nil
}

// checkAnthropicLast refuses a conversation whose last turn is the
// assistant's (a partial turn to continue is not supported). System
// messages may stand anywhere in the list, as Anthropic's API accepts them
// (Claude Code sends its environment block as one after the first user turn,
// and at the end of a request): they are passed over, so the turn they follow
// decides; the template renders them where they stand, or folds them as its
// model can (the Jinja template's fallback family, systemText).
func checkAnthropicLast(req []anthropicMessage, msgs []parley.Message) error {
	i := len(msgs) - 1
	for i > 0 && msgs[i].Role == parley.RoleSystem {
		i--
	}
	if r := msgs[i].Role; r == parley.RoleUser || r == parley.RoleTool {
		return nil
	}
	last := len(req) - 1
	for last > 0 && req[last].Role == "system" {
		last--
	}
	return parley.FieldErrorf(fmt.Sprintf("messages[%d].role", last),
		"the last message must be the user's (a partial assistant turn to continue is not supported)")
}

// renameThinkField names thinking.budget_tokens where the shared validation
// names the thought's budget.
func renameThinkField(err error) error {
	if f := apicore.ErrorField(err); f == "think_budget" {
		return apicore.RenameField(err, f, "thinking.budget_tokens")
	}
	return err
}

// clampAnthropicMaxTokens lowers a max_tokens that this server would
// refuse to one it serves: Anthropic's clients send max_tokens as a generous
// upper bound (Claude Code asks for 32,000 and more), which is past Parley's
// reply cap (--max-tokens-limit) and often past the context window. Above
// the cap it becomes the cap; at or above the context length, half the
// context (the rest holds the conversation). A reply cut there ends with
// stop_reason max_tokens. Values the server serves, and values below 1
// (refused by validation), are left alone.
func (s *API) clampAnthropicMaxTokens(n int) int {
	if limit := s.core.MaxTokensCap; limit > 0 && n > limit {
		n = limit
	}
	if s.core.ModelInfo != nil {
		if ctx := s.core.ModelInfo().ContextLength; ctx > 1 && n >= ctx {
			n = ctx / 2
		}
	}
	return n
}

// checkAnthropicMetadata checks metadata, which is accepted and not used:
// an object ({"user_id": ...}).
func checkAnthropicMetadata(raw json.RawMessage) error {
	if apicore.IsSet(raw) {
		var md map[string]json.RawMessage
		if err := json.Unmarshal(raw, &md); err != nil {
			return parley.FieldErrorf("metadata", "must be an object")
		}
	}
	return nil
}

// parseAnthropicSystem takes system: a string or an array of text blocks,
// joined with newlines, with volatile header blocks dropped
// (stripVolatileSystem).
func parseAnthropicSystem(raw json.RawMessage, blocks *blockCounter) (string, error) {
	if !apicore.IsSet(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", parley.FieldErrorf("system", "invalid string: %v", err)
		}
		return stripVolatileSystem(s), nil
	}
	var bs []json.RawMessage
	if err := json.Unmarshal(raw, &bs); err != nil {
		return "", parley.FieldErrorf("system", "must be a string or an array of text blocks")
	}
	if err := blocks.add(len(bs), "system"); err != nil {
		return "", err
	}
	var parts []string
	for i, b := range bs {
		field := fmt.Sprintf("system[%d]", i)
		blk, err := decodeAnthropicBlock(b, field)
		if err != nil {
			return "", err
		}
		if blk.Type != "text" {
			return "", parley.FieldErrorf(field+".type", "system blocks must be text, got %q", blk.Type)
		}
		if blk.Text == nil {
			return "", parley.FieldErrorf(field+".text", "is required")
		}
		if t := stripVolatileSystem(*blk.Text); t != "" {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, "\n"), nil
}

// stripVolatileSystem drops a leading billing-header line (see
// billingHeaderPrefix) from a system text. It changes on every request, so
// keeping it would defeat the KV cache for the whole conversation after it;
// it says nothing to the model. Only a line at the very start of a text (of
// the system string, or of one of its blocks) is dropped, so an
// instruction that merely mentions the header is kept.
func stripVolatileSystem(s string) string {
	if !strings.HasPrefix(s, billingHeaderPrefix) {
		return s
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimLeft(s[i+1:], "\n")
	}
	return ""
}

// anthropicRole maps a message's role to Parley's.
func anthropicRole(role, field string) (parley.Role, error) {
	switch role {
	case "user":
		return parley.RoleUser, nil
	case "assistant":
		return parley.RoleAssistant, nil
	case "system":
		return parley.RoleSystem, nil
	case "":
		return "", parley.FieldErrorf(field, "is required")
	}
	return "", parley.FieldErrorf(field, "must be user or assistant, got %q", role)
}

// parseAnthropicMessage takes one message of messages: its role and its
// content, a string or an array of blocks, as Parley's messages. Text blocks
// are joined; an assistant's thinking blocks are its reasoning and its
// tool_use blocks its calls; a user's tool_result blocks become tool
// messages before the user's text (a user message of results only is those
// alone); a user's images are its images; documents are refused. ids maps the tool_use ids seen
// so far to their tools' names: a tool_result must answer one of them.
func parseAnthropicMessage(m anthropicMessage, field string, blocks *blockCounter, ids map[string]string, images *apicore.ImageBatch) ([]parley.Message, error) {
	role, err := anthropicRole(m.Role, field+".role")
	if err != nil {
		return nil, err
	}
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, parley.FieldErrorf(field+".content", "is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, parley.FieldErrorf(field+".content", "invalid string: %v", err)
		}
		if err := blocks.add(1, field+".content"); err != nil { // a string is one text block
			return nil, err
		}
		return []parley.Message{{Role: role, Content: s}}, apicore.CheckNotEmpty(role, s, field+".content")
	}
	var bs []json.RawMessage
	if err := json.Unmarshal(raw, &bs); err != nil {
		return nil, parley.FieldErrorf(field+".content", "must be a string or an array of content blocks")
	}
	if err := blocks.add(len(bs), field+".content"); err != nil {
		return nil, err
	}
	msg := parley.Message{Role: role}
	var results []parley.Message
	for j, b := range bs {
		r, err := addAnthropicBlock(&msg, b, fmt.Sprintf("%s.content[%d]", field, j), ids, images)
		if err != nil {
			return nil, err
		}
		if r != nil {
			results = append(results, *r)
		}
	}
	if len(results) > 0 && msg.Content == "" && len(msg.Images) == 0 {
		return results, nil
	}
	if len(msg.ToolCalls) == 0 && len(msg.Images) == 0 {
		if err := apicore.CheckNotEmpty(role, msg.Content, field+".content"); err != nil {
			return nil, err
		}
	}
	return append(results, msg), nil
}

// anthropicImage takes an image block: {"type":"image","source":{"type":"base64","media_type":...,"data":...}}, or
// a source of type url where the server fetches URLs. The format is read from the bytes, never from media_type.
func anthropicImage(raw json.RawMessage, field string, images *apicore.ImageBatch) (parley.ImagePart, error) {
	var blk struct {
		Source struct {
			Type string `json:"type"`
			Data string `json:"data"`
			URL  string `json:"url"`
		} `json:"source"`
	}
	if err := json.Unmarshal(raw, &blk); err != nil {
		return parley.ImagePart{}, parley.FieldErrorf(field+".source", "must be an object with type and data")
	}
	switch blk.Source.Type {
	case "base64":
		return images.Base64(field, blk.Source.Data)
	case "url":
		return images.URL(field, blk.Source.URL)
	case "":
		return parley.ImagePart{}, parley.FieldErrorf(field+".source.type", "is required")
	}
	return parley.ImagePart{}, parley.FieldErrorf(field+".source.type", "must be base64 or url, got %q", blk.Source.Type)
}

// addAnthropicBlock adds content block raw (field names it) to msg: text
// to its content, a thought to its reasoning, a tool_use to its calls; a
// tool_result is returned as a tool message.
func addAnthropicBlock(msg *parley.Message, raw json.RawMessage, field string, ids map[string]string, images *apicore.ImageBatch) (*parley.Message, error) {
	blk, err := decodeAnthropicBlock(raw, field)
	if err != nil {
		return nil, err
	}
	switch blk.Type {
	case "text":
		if blk.Text == nil {
			return nil, parley.FieldErrorf(field+".text", "is required")
		}
		msg.Content += *blk.Text
	case "thinking", "redacted_thinking", "tool_use":
		if msg.Role != parley.RoleAssistant {
			return nil, parley.FieldErrorf(field+".type", "%s blocks belong to assistant messages", blk.Type)
		}
		if blk.Type == "tool_use" {
			c, err := toolUseCall(raw, field, ids)
			if err != nil {
				return nil, err
			}
			msg.ToolCalls = append(msg.ToolCalls, c)
		} else if blk.Thinking != nil {
			msg.Reasoning += *blk.Thinking // a redacted thought is opaque: nothing of it is kept
		}
	case "tool_result":
		if msg.Role != parley.RoleUser {
			return nil, parley.FieldErrorf(field+".type", "tool_result blocks belong to user messages")
		}
		r, err := toolResultMessage(raw, field, ids)
		return &r, err
	case "image":
		if msg.Role != parley.RoleUser {
			return nil, parley.FieldErrorf(field+".type", "image blocks belong to user messages")
		}
		im, err := anthropicImage(raw, field, images)
		if err != nil {
			return nil, err
		}
		im.Offset = len(msg.Content) // where it stands among the message's text blocks
		msg.Images = append(msg.Images, im)
	case "document":
		return nil, parley.FieldErrorf(field+".type", "document blocks are not supported: this server reads text and images")
	case "":
		return nil, parley.FieldErrorf(field+".type", "is required")
	default:
		return nil, parley.FieldErrorf(field+".type", "unsupported content block type %q (text, thinking, tool_use and tool_result are)", blk.Type)
	}
	return nil, nil
}

// decodeAnthropicBlock decodes one content block; a field of the wrong
// type is an error naming it (messages[0].content[1].text).
func decodeAnthropicBlock(raw json.RawMessage, field string) (anthropicBlock, error) {
	var blk anthropicBlock
	err := json.Unmarshal(raw, &blk)
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return blk, nil
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return blk, parley.FieldErrorf(field+"."+typeErr.Field, "expected %s, got %s", typeErr.Type, typeErr.Value)
	}
	return blk, parley.FieldErrorf(field, "must be a content block object")
}
