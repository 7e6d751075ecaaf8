package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// POST /api/chat and POST /api/generate: Ollama's replies. Streamed by
// default as NDJSON (application/x-ndjson), one object per piece of text
// and a last one with done: true, done_reason and the timings in
// nanoseconds; with "stream": false, that last object alone, carrying the
// whole reply. An error after the stream began is a last line
// {"error": "..."}, as Ollama writes it.

// ollamaMessage is one message of /api/chat, in and out.
type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	Images    json.RawMessage  `json:"images,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

// ollamaCommon are the fields /api/chat and /api/generate share.
type ollamaCommon struct {
	Model     string          `json:"model"`
	Stream    *bool           `json:"stream"` // absent: true
	Format    json.RawMessage `json:"format"`
	Options   json.RawMessage `json:"options"`
	KeepAlive json.RawMessage `json:"keep_alive"`
	Think     json.RawMessage `json:"think"`
	Tools     json.RawMessage `json:"tools"`
}

type ollamaChatRequest struct {
	ollamaCommon
	Messages []ollamaMessage `json:"messages"`
}

// ollamaMetrics are the last object's counts and timings (nanoseconds).
type ollamaMetrics struct {
	TotalDuration      int64 `json:"total_duration"`
	LoadDuration       int64 `json:"load_duration"`
	PromptEvalCount    int   `json:"prompt_eval_count"`
	PromptEvalDuration int64 `json:"prompt_eval_duration"`
	EvalCount          int   `json:"eval_count"`
	EvalDuration       int64 `json:"eval_duration"`
	// PromptCachedCount is Parley's: of prompt_eval_count, the tokens
	// served from the KV cache rather than evaluated again.
	PromptCachedCount int `json:"prompt_cached_count"`
}

// ollamaChunk is one object of a reply: /api/chat's carry message,
// /api/generate's response (and, last, context).
type ollamaChunk struct {
	Model      string         `json:"model"`
	CreatedAt  string         `json:"created_at"`
	Message    *ollamaMessage `json:"message,omitempty"`
	Response   *string        `json:"response,omitempty"`
	Done       bool           `json:"done"`
	Thinking   string         `json:"thinking,omitempty"` // /api/generate's thought
	DoneReason string         `json:"done_reason,omitempty"`
	Context    []int          `json:"context,omitempty"`
	*ollamaMetrics
}

// ollamaCall is a validated /api/chat or /api/generate request.
type ollamaCall struct {
	facts  apicore.Facts // the request's model and keep-alive
	start  time.Time     // when the request arrived: total_duration counts from it
	params parley.Params
	stream bool
	// unload: keep_alive was 0, so a request with nothing to generate
	// answers done_reason "unload" (the model stays loaded all the same).
	unload bool
	// text makes an object carrying a piece of the reply.
	text func(piece string) ollamaChunk
	// thought makes an object carrying a piece of a reasoning model's thought.
	thought func(piece string) ollamaChunk
	// finish fills in the last object (generate's context).
	finish func(last *ollamaChunk, rep string)
	// calls puts a reply's tool calls in an object (chat's message.tool_calls).
	calls func(ch *ollamaChunk, calls []parley.ToolCall)
}

func ollamaNow() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// parseOllamaCommon validates the shared fields into params and stream.
func (s *API) parseOllamaCommon(c echo.Context, req *ollamaCommon, call *ollamaCall) (*apicore.ParamsPatch, error) {
	model, err := s.checkOllamaModel(req.Model, "model")
	if err != nil {
		return nil, err
	}
	call.facts = apicore.FactsOf(c)
	call.facts.Model = model
	call.stream = req.Stream == nil || *req.Stream
	keep, err := checkKeepAlive(req.KeepAlive)
	if err != nil {
		return nil, err
	}
	call.unload = apicore.IsSet(req.KeepAlive) && keep == 0
	if apicore.IsSet(req.KeepAlive) && s.core.Models != nil {
		call.facts.KeepAlive = &keep
	}
	var patch apicore.ParamsPatch
	if patch.Think, err = s.ollamaThink(model, req.Think); err != nil {
		return nil, err
	}
	info := s.loadedModel(model)
	if err := applyOllamaOptions(req.Options, &patch, ollamaLimits{contextLength: info.ContextLength, maxTokensCap: s.core.MaxTokensCap}); err != nil {
		return nil, err
	}
	if err := applyOllamaFormat(req.Format, &patch); err != nil {
		return nil, err
	}
	return &patch, nil
}

// resolveOllama resolves the patch over the server's defaults, with adds
// (see ResolveParams).
func (s *API) resolveOllama(patch *apicore.ParamsPatch, call *ollamaCall, adds ...func(*parley.Params) error) error {
	p, err := s.core.ResolveParams(patch, adds...)
	if err != nil {
		return renameOllama(err)
	}
	apicore.ResolveSeed(&p)
	p.SkipLogprobs = true
	call.params = p
	return nil
}

// ollamaThink reads think: true or false, or an effort ("low", "medium",
// "high": gpt-oss's), which turns thinking on. Asking a model that has no
// thought to think is a 400, as Ollama answers it; false is always fine.
func (s *API) ollamaThink(model string, raw json.RawMessage) (*bool, error) {
	if !apicore.IsSet(raw) {
		return nil, nil
	}
	var on bool
	if err := json.Unmarshal(raw, &on); err != nil {
		var effort string
		if json.Unmarshal(raw, &effort) != nil {
			return nil, parley.FieldErrorf("think", "must be true, false, or low, medium or high, got %s", jsonKindOf(raw))
		}
		switch effort {
		case "low", "medium", "high":
			on = true
		default:
			return nil, parley.FieldErrorf("think", "must be true, false, or low, medium or high, got %q", effort)
		}
	}
	if on && !s.ollamaThinks(model) {
		return nil, parley.FieldErrorf("think", "%s does not support thinking", s.ollamaModelName(model))
	}
	return &on, nil
}

// ollamaThinks reports whether model (a request's, "" the default) marks a
// thought Parley can split from its answer.
func (s *API) ollamaThinks(model string) bool {
	if s.core.Models != nil {
		t, ok := s.core.TemplateFor(model)
		return ok && chat.ThinkFormatOf(t) != chat.ThinkNone
	}
	if s.core.ThinkFormat == nil {
		return false
	}
	t := s.core.ThinkFormat()
	return t != "" && t != "none"
}

// parseOllamaMessages turns /api/chat's messages into a conversation.
func parseOllamaMessages(in []ollamaMessage, batch *apicore.ImageBatch) ([]parley.Message, error) {
	var msgs []parley.Message
	for i, m := range in {
		field := fmt.Sprintf("messages[%d]", i)
		var images []parley.ImagePart
		if apicore.IsSet(m.Images) && !bytes.Equal(bytes.TrimSpace(m.Images), []byte("[]")) {
			var srcs []string
			if err := json.Unmarshal(m.Images, &srcs); err != nil {
				return nil, parley.FieldErrorf(field+".images", "must be an array of base64 strings")
			}
			if m.Role != "user" {
				return nil, parley.FieldErrorf(field+".images", "only a user's message carries images")
			}
			for j, src := range srcs {
				im, err := batch.Base64(fmt.Sprintf("%s.images[%d]", field, j), src)
				if err != nil {
					return nil, err
				}
				images = append(images, im)
			}
		}
		role := parley.RoleTool
		if m.Role != "tool" {
			r, err := apicore.ParseRole(m.Role, field+".role")
			if err != nil {
				return nil, err
			}
			role = r
		}
		calls, err := parseOllamaToolCalls(m.ToolCalls, role, i, field)
		if err != nil {
			return nil, err
		}
		if role != parley.RoleTool && len(calls) == 0 && len(images) == 0 {
			if err := apicore.CheckNotEmpty(role, m.Content, field+".content"); err != nil {
				return nil, err
			}
		}
		msgs = append(msgs, parley.Message{Role: role, Content: m.Content, Images: images, Reasoning: apicore.AssistantReasoning(role, m.Thinking),
			ToolCalls: calls, Name: m.ToolName})
	}
	if err := answerToolResults(msgs); err != nil {
		return nil, err
	}
	return msgs, nil
}

// Chat is POST /api/chat.
func (s *API) Chat(c echo.Context) error {
	call := &ollamaCall{start: time.Now()}
	body, err := apicore.ReadBody(c)
	if err != nil {
		return err
	}
	var req ollamaChatRequest
	if err := decodeOllama(body, &req); err != nil {
		return err
	}
	patch, err := s.parseOllamaCommon(c, &req.ollamaCommon, call)
	if err != nil {
		return err
	}
	msgs, err := parseOllamaMessages(req.Messages, s.core.Images(c.Request().Context()))
	if err != nil {
		return err
	}
	if err := s.resolveOllama(patch, call, apicore.AddTools(req.Tools, nil, "")); err != nil {
		return err
	}
	model := s.ollamaModelName(call.facts.Model)
	call.text = func(piece string) ollamaChunk {
		return ollamaChunk{Model: model, CreatedAt: ollamaNow(), Message: &ollamaMessage{Role: "assistant", Content: piece}}
	}
	call.calls = func(ch *ollamaChunk, calls []parley.ToolCall) { ch.Message.ToolCalls = ollamaToolCalls(calls) }
	call.thought = func(piece string) ollamaChunk {
		return ollamaChunk{Model: model, CreatedAt: ollamaNow(), Message: &ollamaMessage{Role: "assistant", Thinking: piece}}
	}
	if len(msgs) == 0 {
		// Ollama's way to load a model: a chat with no messages.
		return s.ollamaLoaded(c, call)
	}
	route := "ollama-chat"
	a, err := s.core.StartChat(c, call.facts, route, apicore.ConversationKey(msgs), msgs, call.params)
	if err != nil {
		return renameOllama(err)
	}
	return s.ollamaRespond(c, a, call)
}

// ollamaLoaded answers a request with nothing to generate, as Ollama
// answers one that loads (or, with keep_alive 0, unloads) a model.
func (s *API) ollamaLoaded(c echo.Context, call *ollamaCall) error {
	if err := s.core.Available(); err != nil {
		return err
	}
	last := call.text("")
	last.Done, last.DoneReason = true, "load"
	if call.unload {
		last.DoneReason = "unload"
	}
	return c.JSON(http.StatusOK, last)
}

// ollamaDoneReason is Ollama's done_reason for a finish.
func ollamaDoneReason(f parley.FinishReason) string {
	if f == parley.FinishLength {
		return "length"
	}
	return "stop"
}

// ollamaMetricsOf measures the reply: load_duration is the time from the
// request's arrival until it started to evaluate (validation, templating,
// tokenizing, waiting for a slot; the model itself is always loaded).
func ollamaMetricsOf(call *ollamaCall, submitted time.Time, ev parley.Event) *ollamaMetrics {
	t := ev.Timings
	nonNeg := func(d time.Duration) int64 { return int64(max(d, 0)) }
	return &ollamaMetrics{
		TotalDuration:      nonNeg(time.Since(call.start)),
		LoadDuration:       nonNeg(submitted.Sub(call.start) + t.Queued),
		PromptEvalCount:    ev.Usage.PromptTokens,
		PromptEvalDuration: nonNeg(t.TimeToFirstToken - t.Queued),
		EvalCount:          ev.Usage.CompletionTokens,
		EvalDuration:       nonNeg(t.Total - t.TimeToFirstToken),
		PromptCachedCount:  ev.Usage.CachedPromptTokens,
	}
}

// ollamaRespond sends the reply a, streamed or whole.
func (s *API) ollamaRespond(c echo.Context, a *apicore.Call, call *ollamaCall) error {
	submitted := time.Now()
	last := func(ev parley.Event, text string) ollamaChunk {
		ch := call.text(text)
		ch.Done, ch.DoneReason = true, ollamaDoneReason(ev.Finish)
		ch.ollamaMetrics = ollamaMetricsOf(call, submitted, ev)
		if call.finish != nil {
			call.finish(&ch, a.Rep.Text())
		}
		return ch
	}
	if !call.stream {
		_, ev := a.Collect()
		if rerr := apicore.ReplyError(ev); rerr != nil {
			return renameOllama(rerr)
		}
		whole := last(ev, a.Rep.Text())
		if th := a.Rep.Reasoning(); th != "" {
			if whole.Message != nil {
				whole.Message.Thinking = th
			} else {
				whole.Thinking = th
			}
		}
		if len(ev.ToolCalls) > 0 && call.calls != nil {
			call.calls(&whole, ev.ToolCalls)
		}
		return c.JSON(http.StatusOK, whole)
	}
	w := s.core.BeginStream(c, "application/x-ndjson")
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode ollama object: %w", err)
		}
		return w.Write(append(b, '\n'))
	}
	piece := func(t parley.Token) error {
		if t.Reasoning != "" {
			if err := send(call.thought(t.Reasoning)); err != nil {
				return err
			}
		}
		text := t.Text
		if text == "" {
			return nil // held back (a partial character, a possible stop string) or a special token
		}
		return send(call.text(text))
	}
	err := a.Relay(
		func(t parley.Token, _ int) error { return piece(t) },
		func(held *parley.Token, ev parley.Event) error {
			if held != nil {
				if err := piece(*held); err != nil {
					return err
				}
			}
			if rerr := apicore.ReplyError(ev); rerr != nil {
				return send(ollamaError{parley.ErrorMessage(renameOllama(rerr))})
			}
			if len(ev.ToolCalls) > 0 && call.calls != nil {
				// Ollama sends a call whole, in an object of its own.
				ch := call.text("")
				call.calls(&ch, ev.ToolCalls)
				if err := send(ch); err != nil {
					return err
				}
			}
			return send(last(ev, ""))
		})
	if err != nil {
		s.core.Log.Debug("ollama stream ended early", zap.String("route", a.Route), zap.Error(err))
	}
	return nil
}
