// Package openai serves OpenAI's chat completions, as the official client libraries use them:
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
// refused rather than ignored; tools are tools.go's. The legacy
// completions (POST /v1/completions) are completions.go's. Errors are
// OpenAI's error object (ErrorBody).
package openai

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/servertools"
)

// chatCall is a decoded, validated chat completion request.
type chatCall struct {
	facts        apicore.Facts
	msgs         []parley.Message
	params       parley.Params
	stream       bool
	includeUsage bool
	logprobs     bool
	topLogprobs  int
	renameSent   func(error) error   // names the field the client sent in an error from the engine
	server       *toolloop.Selection // the tools that run on the server (mcp.go); nil: none
}

func (s *API) parseChat(c echo.Context) (*chatCall, error) {
	var req chatRequest
	facts, err := s.decodeRequest(c, &req, &req.openAIRequest)
	if err != nil {
		return nil, err
	}
	if len(req.Messages) == 0 {
		return nil, parley.FieldErrorf("messages", "at least one message is required")
	}
	call := &chatCall{facts: facts, stream: req.Stream, logprobs: req.Logprobs}
	images := s.core.Images(c.Request().Context())
	for i, m := range req.Messages {
		msg, err := parseChatMessage(m, i, images)
		if err != nil {
			return nil, err
		}
		call.msgs = append(call.msgs, msg)
	}
	if err := checkToolResults(call.msgs); err != nil {
		return nil, err
	}
	if err := req.unsupported(); err != nil {
		return nil, err
	}
	if req.TopLogprobs != nil {
		if *req.TopLogprobs < 0 || *req.TopLogprobs > apicore.MaxTopN {
			return nil, parley.FieldErrorf("top_logprobs", "must be between 0 and %d, got %d", apicore.MaxTopN, *req.TopLogprobs)
		}
		if *req.TopLogprobs > 0 && !req.Logprobs {
			return nil, parley.FieldErrorf("top_logprobs", "needs logprobs: true")
		}
		call.topLogprobs = *req.TopLogprobs
	}
	call.includeUsage = req.includeUsage()
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
	functions, server, err := servertools.SplitTools(req.Tools, "tools")
	if err != nil {
		return nil, err
	}
	call.server = server
	p, err := s.core.ResolveParams(&req.ParamsPatch, apicore.AddTools(functions, req.ToolChoice, ""))
	if err != nil {
		return nil, err
	}
	apicore.ResolveSeed(&p)
	p.SkipLogprobs = !req.Logprobs
	call.params = p
	call.renameSent = req.ParamsPatch.RenameSent
	return call, nil
}

// ChatCompletions is POST /v1/chat/completions.
func (s *API) ChatCompletions(c echo.Context) error {
	cc, err := s.parseChat(c)
	if err != nil {
		return err
	}
	route := "openai"
	if cc.stream {
		route = "openai-stream"
	}
	if cc.server != nil {
		return s.chatWithServerTools(c, cc, route)
	}
	call, err := s.core.StartChat(c, cc.facts, route, apicore.ConversationKey(cc.msgs), cc.msgs, cc.params)
	if err != nil {
		return cc.renameSent(err)
	}
	call.TopLogprobs = cc.topLogprobs
	id, created, model := completionID(), time.Now().Unix(), s.core.ModelName(cc.facts.Model)
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

// API serves OpenAI's chat completions, completions and model endpoints
// over the shared core.
type API struct {
	core *apicore.Core
}

// New returns the endpoints over core.
func New(core *apicore.Core) *API { return &API{core: core} }
