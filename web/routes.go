package web

// The route table: the one place that knows every API family.
//
//	GET  /, /ws                 the chat page and the WebSocket chat                                  (ws.go)
//	POST /                      plain text, chunked (Ray Serve Textbot): ?prompt=... or a text body  (api_plain.go)
//	POST /generate              TGI, one JSON response                                                (api_tgi.go)
//	POST /generate_stream       TGI, server-sent events
//	POST /invocations           SageMaker: TGI's events when "stream": true, else [{"generated_text"}]
//	POST /generate?format=jsonlines             DJL-style JSON lines, one object per token           (api_jsonl.go)
//	POST /generate?format=jsonlines-cumulative  the same, each line carrying the text so far
//	POST /v1/chat/completions   OpenAI chat completions, streamed or not                              (api_openai.go)
//	POST /v1/completions        OpenAI legacy completions (raw prompt), streamed or not               (api_completions.go)
//	GET  /v1/models             OpenAI model list (Anthropic's for Anthropic's clients)
//	POST /v1/messages           Anthropic Messages, streamed or not; /v1/messages/count_tokens          (api_anthropic.go)
//	/v1/responses, /v1/conversations  OpenAI's Responses and Conversations APIs over the sessions (api_responses.go)
//	/api/chat, /api/generate, /api/tags, /api/show, ...  Ollama's API (api_ollama*.go)
//	/admin/models/...           load and unload models (models.go)
//	/health, /ready, /info, /metrics  operations (info.go, metrics.go)
//
// Every family decodes and validates a request with the shared core
// (internal/apicore) and answers errors in its own shape (errorBodyFor).

import (
	"io/fs"
	"net/http"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// The server's contract with the layers it runs on, declared in the core.
type (
	// Responder is what the HTTP APIs need from the chat layer
	// (*chat.Responder satisfies it).
	Responder = apicore.Responder
	// Tokenizer counts the tokens of a prompt for Config.MaxPromptTokens
	// (*llm.Engine satisfies it). It must be safe for concurrent use.
	Tokenizer = apicore.Tokenizer
	// Models is the registry of the models a server serves when it serves
	// several (cmd/parley adapts llm/registry to it).
	Models = apicore.Models
	// ModelStatus is one model as /v1/models, /health and Ollama's
	// /api/tags and /api/ps show it.
	ModelStatus = apicore.ModelStatus
	// ErrorBody is the JSON error of Parley's own endpoints.
	ErrorBody = apicore.ErrorBody
)

// apiDeps is what the Responses and Conversations APIs run on besides the core.
type apiDeps struct {
	convs Conversations // the Responses and Conversations APIs' sessions (api_responses.go); nil: not mounted
	items itemSessions  // the sessions of recent stored responses, for item_reference inputs (api_responses_refs.go)
}

// WithResponder mounts the HTTP streaming APIs (plain, TGI/SageMaker, JSON
// lines, OpenAI, Anthropic, Ollama, Responses) over r. Without it the
// server speaks WebSocket only.
func WithResponder(r Responder) Option {
	return func(s *Server) {
		if s.core.Responder == nil {
			s.mounts = append(s.mounts, s.mountAPI)
		}
		s.core.Responder = r
	}
}

// WithModelInfo gives the APIs the loaded model's facts (for /v1/models and
// the model name in responses).
func WithModelInfo(info func() parley.ModelInfo) Option {
	return func(s *Server) { s.core.ModelInfo = info }
}

// initCore fills the core every family runs on from the server's settings
// and hooks, once the options are applied.
func (s *Server) initCore() {
	k := s.core
	k.Log = s.log
	k.Models = s.models
	k.Defaults = s.cfg.Defaults
	k.MaxTokensCap = s.cfg.MaxTokensCap
	k.MaxPromptTokens = s.cfg.MaxPromptTokens
	k.WriteWait = s.cfg.WriteWait
	k.PingPeriod = s.pingPeriod()
	k.Available = s.apiAvailable
	k.Meter = func(model string) apicore.Meter { return s.meterReply(s.requestCancelCause).forModel(model) }
	k.ErrorBody = errorBodyFor
	k.Operator = s.operator
	if s.models != nil {
		k.Alias = s.ollamaAlias
	}
}

// apiAvailable refuses requests while the model loads or the server drains.
func (s *Server) apiAvailable() error {
	if !s.ready.Load() {
		return parley.Errorf(parley.EUnavailable, "the model is loading; try again shortly")
	}
	if s.draining.Load() {
		return parley.Errorf(parley.EUnavailable, "the server is shutting down")
	}
	return nil
}

// mountAPI adds the API routes; RequireKey guards them all.
func (s *Server) mountAPI(e *echo.Echo) {
	s.core.Mounted = time.Now()
	g := e.Group("", s.RequireKey)
	g.POST("/", s.handlePlain)
	g.POST("/generate", s.handleGenerate)
	g.POST("/generate_stream", s.handleGenerateStream)
	g.POST("/invocations", s.handleInvocations)
	g.POST("/v1/chat/completions", s.handleChatCompletions)
	g.POST("/v1/completions", s.handleCompletions)
	if s.models != nil {
		g.GET("/v1/models", anthropicOr(s.handleModelsList, s.handleAnthropicModels))
		g.GET("/v1/models/:id", anthropicOr(s.handleModelsOne, s.handleAnthropicModel))
		s.mountAdmin(g)
	} else {
		g.GET("/v1/models", anthropicOr(s.handleModels, s.handleAnthropicModels))
		g.GET("/v1/models/:id", anthropicOr(s.handleModel, s.handleAnthropicModel))
	}
	g.POST("/v1/messages", s.handleMessages)
	g.POST("/v1/messages/count_tokens", s.handleCountTokens)
	if cs, ok := s.sessions.(Conversations); ok {
		s.mountResponses(g, cs)
	}
	s.mountOllama(e, g)
}
func (s *Server) routes() {
	e := s.echo
	e.Use(s.trackRequest, s.bodyDeadline, s.countRefusals, s.guardHost, s.requireReady, s.tagClient, s.limitBodies)
	e.GET("/", s.handleRoot)
	e.GET("/ws", s.handleWebSocket)
	sub, _ := fs.Sub(uiFiles, "ui")
	e.GET("/ui/*", echo.WrapHandler(http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))))
	s.opsRoutes(e)
	for _, m := range s.mounts {
		m(e)
	}
}

func (s *Server) handleRoot(c echo.Context) error {
	if websocket.IsWebSocketUpgrade(c.Request()) {
		return s.handleWebSocket(c)
	}
	page, err := uiFiles.ReadFile("ui/index.html")
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.HTMLBlob(http.StatusOK, page)
}
