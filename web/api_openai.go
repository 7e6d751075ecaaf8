package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// OpenAI's chat completions, as the official client libraries use them:
// POST /v1/chat/completions (streamed as server-sent events "data: {chunk}"
// ending with "data: [DONE]", or one response) and GET /v1/models.
//
// Supported: messages (string content or text parts; roles system,
// developer, user, assistant), max_tokens / max_completion_tokens,
// temperature, top_p, presence/frequency_penalty, seed, stop, n = 1,
// logprobs + top_logprobs, stream_options.include_usage, response_format
// json_object / json_schema, and Parley's own sampling fields (top_k, min_p,
// repetition_penalty, grammar, json_schema). Usage carries
// prompt_tokens_details.cached_tokens; the last chunk (or the response) a
// "timings" object like llama.cpp's server. top_logprobs lists only the
// sampled token: the engine reports no other candidates. logit_bias is
// refused rather than ignored; tools are api_openai_tools.go's.

// openAIMessage is one message of a request. Content is a string or an
// array of parts; only text parts are accepted.
type openAIMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"`
	ToolCalls  []openAIToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	Name       string           `json:"name"`
	// ReasoningContent is an assistant message's thought, as clients send back what they received (the template
	// decides whether the prompt keeps it).
	ReasoningContent string `json:"reasoning_content"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

type chatRequest struct {
	apicore.ParamsPatch
	apicore.CacheKeyFields
	Model         string          `json:"model"`
	Messages      []openAIMessage `json:"messages"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N              *int            `json:"n"`
	Logprobs       bool            `json:"logprobs"`
	TopLogprobs    *int            `json:"top_logprobs"`
	ResponseFormat *responseFormat `json:"response_format"`
	Tools          json.RawMessage `json:"tools"`
	ToolChoice     json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls is accepted; a reply makes at most one call.
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	LogitBias         json.RawMessage `json:"logit_bias"`
}

type openAIUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

func newOpenAIUsage(u parley.Usage) *openAIUsage {
	o := &openAIUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
	o.PromptTokensDetails.CachedTokens = u.CachedPromptTokens
	o.CompletionTokensDetails.ReasoningTokens = u.ReasoningTokens
	return o
}

type topLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type tokenLogprob struct {
	topLogprob
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
	Refusal []tokenLogprob `json:"refusal"`
}

type chatMessageOut struct {
	Role      string           `json:"role"`
	Content   *string          `json:"content"` // null when the reply is only tool calls
	Refusal   *string          `json:"refusal"`
	ToolCalls []openAIToolCall `json:"tool_calls,omitempty"`
	// ReasoningContent is a reasoning model's thought, as llama.cpp's server and DeepSeek's API name it.
	ReasoningContent string `json:"reasoning_content,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatCompletion struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"` // "chat.completion"
	Created           int64            `json:"created"`
	Model             string           `json:"model"`
	SystemFingerprint string           `json:"system_fingerprint"`
	Choices           []chatChoice     `json:"choices"`
	Usage             *openAIUsage     `json:"usage"`
	Timings           *apicore.Timings `json:"timings,omitempty"` // Parley's (and llama.cpp's) extension
}

type chunkDelta struct {
	Role             string           `json:"role,omitempty"`
	Content          *string          `json:"content,omitempty"`
	ReasoningContent *string          `json:"reasoning_content,omitempty"`
	ToolCalls        []openAIToolCall `json:"tool_calls,omitempty"`
}

type chunkChoice struct {
	Index        int           `json:"index"`
	Delta        chunkDelta    `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatChunk struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"` // "chat.completion.chunk"
	Created           int64            `json:"created"`
	Model             string           `json:"model"`
	SystemFingerprint string           `json:"system_fingerprint"`
	Choices           []chunkChoice    `json:"choices"`
	Usage             json.RawMessage  `json:"usage,omitempty"` // null on every chunk but the last when include_usage is set
	Timings           *apicore.Timings `json:"timings,omitempty"`
}

// openAIFinish maps a finish reason to OpenAI's; "" for the ones reported as errors.
func openAIFinish(f parley.FinishReason) string {
	switch f {
	case parley.FinishStop, parley.FinishEOS:
		return "stop"
	case parley.FinishLength:
		return "length"
	case parley.FinishToolCalls:
		return "tool_calls"
	}
	return ""
}

// systemFingerprint identifies the configuration that produced a reply.
const systemFingerprint = "parley"

// chatCall is a decoded, validated chat completion request.
type chatCall struct {
	msgs         []parley.Message
	params       parley.Params
	stream       bool
	includeUsage bool
	logprobs     bool
	topLogprobs  int
	renameSent   func(error) error // names the field the client sent in an error from the engine
}

func (s *Server) parseChat(c echo.Context) (*chatCall, error) {
	body, err := apicore.ReadBody(c)
	if err != nil {
		return nil, err
	}
	var req chatRequest
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return nil, err
	}
	if err := s.core.PickModel(c, req.Model); err != nil {
		return nil, err
	}
	if err := apicore.NarrowRequest(c, &req.CacheKeyFields); err != nil {
		return nil, err
	}
	if len(req.Messages) == 0 {
		return nil, parley.FieldErrorf("messages", "at least one message is required")
	}
	call := &chatCall{stream: req.Stream, logprobs: req.Logprobs}
	for i, m := range req.Messages {
		msg, err := parseChatMessage(m, i)
		if err != nil {
			return nil, err
		}
		call.msgs = append(call.msgs, msg)
	}
	if err := checkToolResults(call.msgs); err != nil {
		return nil, err
	}
	if req.N != nil && *req.N != 1 {
		return nil, parley.FieldErrorf("n", "only 1 is supported, got %d", *req.N)
	}
	if apicore.IsSet(req.LogitBias) && !bytes.Equal(bytes.TrimSpace(req.LogitBias), []byte("{}")) {
		return nil, parley.FieldErrorf("logit_bias", "is not supported")
	}
	if req.TopLogprobs != nil {
		if *req.TopLogprobs < 0 || *req.TopLogprobs > maxTopN {
			return nil, parley.FieldErrorf("top_logprobs", "must be between 0 and %d, got %d", maxTopN, *req.TopLogprobs)
		}
		if *req.TopLogprobs > 0 && !req.Logprobs {
			return nil, parley.FieldErrorf("top_logprobs", "needs logprobs: true")
		}
		call.topLogprobs = *req.TopLogprobs
	}
	if req.StreamOptions != nil {
		call.includeUsage = req.StreamOptions.IncludeUsage
	}
	if rf := req.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			req.ParamsPatch.JSONSchema = json.RawMessage(`{"type":"object"}`)
			req.ParamsPatch.SchemaField = "response_format"
		case "json_schema":
			if rf.JSONSchema == nil || !apicore.IsSet(rf.JSONSchema.Schema) {
				return nil, parley.FieldErrorf("response_format.json_schema.schema", "is required")
			}
			req.ParamsPatch.JSONSchema = rf.JSONSchema.Schema
			req.ParamsPatch.SchemaField = "response_format.json_schema.schema"
		default:
			return nil, parley.FieldErrorf("response_format.type", "must be text, json_object or json_schema, got %q", rf.Type)
		}
	}
	p, err := s.core.ResolveParams(&req.ParamsPatch)
	if err != nil {
		return nil, err
	}
	if p.Tools, err = apicore.ParseTools(req.Tools, "tools"); err != nil {
		return nil, err
	}
	if p.ToolChoice, err = apicore.ParseToolChoice(req.ToolChoice, "tool_choice"); err != nil {
		return nil, err
	}
	if err := p.Validate(s.cfg.MaxTokensCap); err != nil {
		return nil, err
	}
	apicore.ResolveSeed(&p)
	p.SkipLogprobs = !req.Logprobs
	call.params = p
	call.renameSent = req.ParamsPatch.RenameSent
	return call, nil
}

func completionID() string {
	return fmt.Sprintf("chatcmpl-%016x%08x", rand.Uint64(), rand.Uint32())
}

// tokenLogprobOf is t's logprob entry; with top > 0 its top_logprobs list
// holds the sampled token (the engine reports no other candidates).
func tokenLogprobOf(t parley.Token, top int) tokenLogprob {
	b := make([]int, len(t.Text))
	for i := range len(t.Text) {
		b[i] = int(t.Text[i])
	}
	lp := tokenLogprob{topLogprob: topLogprob{Token: t.Text, Logprob: apicore.Finite(t.Logprob), Bytes: b}, TopLogprobs: []topLogprob{}}
	if top > 0 {
		lp.TopLogprobs = append(lp.TopLogprobs, lp.topLogprob)
	}
	return lp
}

// handleChatCompletions is POST /v1/chat/completions.
func (s *Server) handleChatCompletions(c echo.Context) error {
	cc, err := s.parseChat(c)
	if err != nil {
		return err
	}
	route := "openai"
	if cc.stream {
		route = "openai-stream"
	}
	call, err := s.core.StartChat(c, route, apicore.ConversationKey(cc.msgs), cc.msgs, cc.params)
	if err != nil {
		return cc.renameSent(err)
	}
	call.TopLogprobs = cc.topLogprobs
	id, created, model := completionID(), time.Now().Unix(), s.core.ModelName(c.Request().Context())
	if !cc.stream {
		toks, ev := call.Collect()
		if rerr := apicore.ReplyError(ev); rerr != nil {
			return cc.renameSent(rerr)
		}
		text := call.Rep.Text()
		choice := chatChoice{
			Message:      chatMessageOut{Role: "assistant", Content: &text, ReasoningContent: call.Rep.Reasoning()},
			FinishReason: openAIFinish(ev.Finish),
		}
		if len(ev.ToolCalls) > 0 {
			choice.Message.ToolCalls = openAIToolCalls(ev.ToolCalls)
			if text == "" {
				choice.Message.Content = nil
			}
		}
		if cc.logprobs {
			choice.Logprobs = &chatLogprobs{Content: []tokenLogprob{}}
			for _, t := range toks {
				choice.Logprobs.Content = append(choice.Logprobs.Content, tokenLogprobOf(t, cc.topLogprobs))
			}
		}
		timings := apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens)
		return c.JSON(http.StatusOK, chatCompletion{
			ID: id, Object: "chat.completion", Created: created, Model: model, SystemFingerprint: systemFingerprint,
			Choices: []chatChoice{choice},
			Usage:   newOpenAIUsage(ev.Usage),
			Timings: &timings,
		})
	}

	chunk := func(choices []chunkChoice) chatChunk {
		ch := chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			SystemFingerprint: systemFingerprint, Choices: choices}
		if cc.includeUsage {
			ch.Usage = json.RawMessage("null")
		}
		return ch
	}
	call.OnTool = func(d parley.ToolCallDelta) any {
		return chunk([]chunkChoice{{Delta: chunkDelta{ToolCalls: openAIToolDelta(d)}}})
	}
	s.streamOpenAI(c, call, cc.logprobs, cc.includeUsage, openAIChunks{
		first: func() any {
			// The first chunk carries the role, as OpenAI's does.
			empty := ""
			return chunk([]chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}})
		},
		text: func(text string, lps []tokenLogprob) any {
			choice := chunkChoice{Delta: chunkDelta{Content: &text}}
			if cc.logprobs {
				choice.Logprobs = &chatLogprobs{Content: lps}
			}
			return chunk([]chunkChoice{choice})
		},
		reasoning: func(text string) any {
			return chunk([]chunkChoice{{Delta: chunkDelta{ReasoningContent: &text}}})
		},
		final: func(finish string, lps []tokenLogprob, timings apicore.Timings) any {
			final := chunkChoice{Delta: chunkDelta{}, FinishReason: &finish}
			if len(lps) > 0 {
				final.Logprobs = &chatLogprobs{Content: lps}
			}
			last := chunk([]chunkChoice{final})
			last.Timings = &timings
			return last
		},
		usage: func(u json.RawMessage) any {
			uc := chunk([]chunkChoice{})
			uc.Usage = u
			return uc
		},
	})
	return nil
}

// openAIChunks makes the server-sent chunks of one OpenAI streaming API (chat
// or legacy completions); streamOpenAI owns the order and the rules.
type openAIChunks struct {
	first func() any                                // optional: the chunk before any text
	text  func(text string, lps []tokenLogprob) any // a chunk of reply text; lps: the logprobs of its tokens, when asked for
	// reasoning, optional, is a chunk of a reasoning model's thought (it precedes the answer's chunks).
	reasoning func(text string) any
	final     func(finish string, lps []tokenLogprob, timings apicore.Timings) any // the chunk with the finish reason
	usage     func(usage json.RawMessage) any                                      // the usage chunk (stream_options.include_usage)
}

// streamOpenAI relays call's reply as OpenAI server-sent events ("data:
// {chunk}" ... "data: [DONE]"); an error after the stream began is one
// OpenAI error event.
func (s *Server) streamOpenAI(c echo.Context, call *apicore.Call, logprobs, includeUsage bool, ch openAIChunks) {
	w := s.core.BeginStream(c, "text/event-stream")
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode chunk: %w", err)
		}
		return w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
	}
	// Tokens whose text is held back (a partial character, a possible stop
	// string) or empty (special tokens) make no chunk of their own; their
	// logprobs ride with the next chunk.
	var pendingLP []tokenLogprob
	content := func(text string, t *parley.Token) error {
		if t != nil && t.Reasoning != "" && ch.reasoning != nil {
			if err := send(ch.reasoning(t.Reasoning)); err != nil {
				return err
			}
		}
		if logprobs && t != nil {
			pendingLP = append(pendingLP, tokenLogprobOf(*t, call.TopLogprobs))
		}
		if text == "" {
			return nil
		}
		lps := pendingLP
		pendingLP = nil
		return send(ch.text(text, lps))
	}
	if call.OnTool != nil {
		call.Tool = func(d parley.ToolCallDelta) error { return send(call.OnTool(d)) }
	}
	if ch.first != nil {
		if err := send(ch.first()); err != nil {
			call.Cancel()
			call.Collect()
			return
		}
	}
	err := call.Relay(
		func(t parley.Token, _ int) error { return content(t.Text, &t) },
		func(last *parley.Token, ev parley.Event) error {
			if last != nil {
				if err := content(last.Text, last); err != nil {
					return err
				}
			}
			if rerr := apicore.ReplyError(ev); rerr != nil {
				return send(openAIErrorBody{newOpenAIError(rerr)})
			}
			if err := send(ch.final(openAIFinish(ev.Finish), pendingLP, apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens))); err != nil {
				return err
			}
			if includeUsage {
				u, err := json.Marshal(newOpenAIUsage(ev.Usage))
				if err != nil {
					return fmt.Errorf("encode usage: %w", err)
				}
				if err := send(ch.usage(u)); err != nil {
					return err
				}
			}
			return w.Write([]byte("data: [DONE]\n\n"))
		})
	if err != nil {
		s.log.Debug("openai stream ended early", zap.String("route", call.Route), zap.Error(err))
	}
}

type openAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) openAIModel() openAIModel {
	return openAIModel{ID: s.core.ModelName(context.Background()), Object: "model", Created: s.core.Mounted.Unix(), OwnedBy: "parley"}
}

// handleModels is GET /v1/models: the one loaded model.
func (s *Server) handleModels(c echo.Context) error {
	return c.JSON(http.StatusOK, struct {
		Object string        `json:"object"`
		Data   []openAIModel `json:"data"`
	}{"list", []openAIModel{s.openAIModel()}})
}

// handleModel is GET /v1/models/{id}.
func (s *Server) handleModel(c echo.Context) error {
	m := s.openAIModel()
	if c.Param("id") != m.ID {
		return parley.Errorf(parley.ENotFound, "no model %q: this server serves %q", c.Param("id"), m.ID)
	}
	return c.JSON(http.StatusOK, m)
}
