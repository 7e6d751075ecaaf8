package web

// The route table: the one place that knows every API family.
//
//	GET  /, /ws                 the chat page and the WebSocket chat                                  (chatsocket/)
//	POST /                      plain text, chunked (Ray Serve Textbot): ?prompt=... or a text body  (tgi/plain.go)
//	POST /generate              TGI, one JSON response                                                (tgi/tgi.go)
//	POST /generate_stream       TGI, server-sent events
//	POST /invocations           SageMaker: TGI's events when "stream": true, else [{"generated_text"}]
//	POST /generate?format=jsonlines             DJL-style JSON lines, one object per token           (tgi/jsonl.go)
//	POST /generate?format=jsonlines-cumulative  the same, each line carrying the text so far
//	POST /v1/chat/completions   OpenAI chat completions, streamed or not                              (openai/)
//	POST /v1/completions        OpenAI legacy completions (raw prompt), streamed or not               (openai/completions.go)
//	GET  /v1/models             OpenAI model list (Anthropic's for Anthropic's clients)
//	POST /v1/messages           Anthropic Messages, streamed or not; /v1/messages/count_tokens          (anthropic/)
//	/v1/responses, /v1/conversations  OpenAI's Responses and Conversations APIs over the sessions (responses/)
//	/api/chat, /api/generate, /api/tags, /api/show, ...  Ollama's API (ollama/)
//	POST /v1/embeddings, /api/embed, /api/embeddings  embeddings (embeddings.go, embed/)
//	POST /v1/rerank, /v1/reranking, /rerank, /reranking  rerank, llama-server's and Jina's/Cohere's shape
//	/admin/models/...           load and unload models (admin.go)
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
	"github.com/parley-chat/parley/web/anthropic"
	"github.com/parley-chat/parley/web/chatsocket"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/ollama"
	"github.com/parley-chat/parley/web/openai"
	"github.com/parley-chat/parley/web/responses"
	"github.com/parley-chat/parley/web/tgi"
)

// The server's contract with the layers it runs on, declared in the core.
type (
	// Responder is what the HTTP APIs start replies with: the root
	// package's contract (*chat.Responder satisfies it).
	Responder = parley.Responder
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
	// Conversations is what the Responses and Conversations APIs need from
	// the session layer (*session.Service satisfies it). The APIs are
	// mounted when the server's Sessions implements it.
	Conversations = responses.Conversations
)

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

// DefaultResumeBuffer is Config.ResumeBuffer's default: tokens a reply may
// generate while no client follows it.
const DefaultResumeBuffer = chatsocket.DefaultResumeBuffer

// ThinkOpen and ThinkClose are the text frames that enclose a thought in
// the chat socket's text mode with ?thinking=show.
const (
	ThinkOpen  = chatsocket.ThinkOpen
	ThinkClose = chatsocket.ThinkClose
)

// initChat builds the chat WebSocket over the core, the server's sockets
// and its sessions.
func (s *Server) initChat() {
	s.chat = chatsocket.New(s.core, sockets{s}, s.sessions, chatsocket.Settings{
		Defaults: s.cfg.Defaults, MaxTokensCap: s.cfg.MaxTokensCap, MaxMessageBytes: s.cfg.MaxMessageBytes,
		MaxImageMessageBytes: s.cfg.MaxMessageBytes + s.core.ImagePolicy.Limits.MaxSourceBytes(),
		PromptsPerMinute:     s.cfg.PromptsPerMinute, MaxQueuedPrompts: s.cfg.MaxQueuedPrompts,
		ResumeGrace: s.cfg.ResumeGrace, ResumeBuffer: s.cfg.ResumeBuffer,
	}, chatsocket.Hooks{
		Refused:      s.refused,
		CountRefusal: s.countRefusal,
		CacheScope:   s.cacheScope,
		Meter: func(cancelCause func() string, model string) apicore.Meter {
			return s.meterReply(cancelCause).forModel(model)
		},
		CountTurn: func(kv string) { s.ops().kvTurns.WithLabelValues(kv).Inc() },
	}, s.stop, &s.draining)
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
	k.ThinkFormat = func() string {
		if s.op.info == nil {
			return ""
		}
		return s.op.info().Thinking
	}
	if s.models != nil {
		k.Alias = func(name string) (string, bool) { return ollama.Alias(s.models.Models(), name) }
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
	tg := tgi.New(s.core)
	g.POST("/", tg.Plain)
	g.POST("/generate", tg.Generate)
	g.POST("/generate_stream", tg.GenerateStream)
	g.POST("/invocations", tg.Invocations)
	oa := openai.New(s.core)
	g.POST("/v1/chat/completions", oa.ChatCompletions)
	g.POST("/v1/completions", oa.Completions)
	an := anthropic.New(s.core)
	if s.models != nil {
		g.GET("/v1/models", anthropicOr(s.handleModelsList, an.Models))
		g.GET("/v1/models/:id", anthropicOr(s.handleModelsOne, an.Model))
		s.mountAdmin(g)
	} else {
		g.GET("/v1/models", anthropicOr(oa.Models, an.Models))
		g.GET("/v1/models/:id", anthropicOr(oa.Model, an.Model))
	}
	g.POST("/v1/messages", an.Messages)
	g.POST("/v1/messages/count_tokens", an.CountTokens)
	if cs, ok := s.sessions.(Conversations); ok {
		rs := responses.New(s.core, sockets{s}, cs, s.stop)
		s.resp = rs
		g.POST("/v1/responses", rs.CreateResponse)
		g.GET("/v1/responses", rs.ResponsesWS)
		g.GET("/v1/responses/:id", rs.GetResponse)
		g.DELETE("/v1/responses/:id", rs.DeleteResponse)
		g.GET("/v1/responses/:id/input_items", rs.InputItems)
		g.POST("/v1/responses/:id/cancel", rs.CancelResponse)
		g.POST("/v1/conversations", rs.CreateConversation)
		g.GET("/v1/conversations", rs.ListConversations)
		g.POST("/v1/conversations/:id/fork", rs.ForkConversation)
		g.GET("/v1/conversations/:id", rs.GetConversation)
		g.POST("/v1/conversations/:id", rs.UpdateConversation)
		g.DELETE("/v1/conversations/:id", rs.DeleteConversation)
		g.GET("/v1/conversations/:id/items", rs.ListItems)
		g.POST("/v1/conversations/:id/items", rs.AddItems)
		g.GET("/v1/conversations/:id/items/:item", rs.GetItem)
		g.DELETE("/v1/conversations/:id/items/:item", rs.DeleteItem)
	}
	// Ollama's routes, and the HEAD / probe, which needs no key: it says
	// only that a server is there.
	ol := ollama.New(s.core)
	e.HEAD("/", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	g.GET("/api/version", ol.Version)
	g.HEAD("/api/version", ol.Version)
	g.GET("/api/tags", ol.Tags)
	g.HEAD("/api/tags", ol.Tags)
	g.POST("/api/show", ol.Show)
	g.GET("/api/ps", ol.PS)
	g.POST("/api/chat", ol.Chat)
	g.POST("/api/generate", ol.Generate)
	if s.embeds != nil {
		s.mountEmbed(g)
	}
	ollama.MountUnsupported(g, s.embeds != nil)
}
func (s *Server) routes() {
	e := s.echo
	e.Use(s.trackRequest, s.bodyDeadline, s.countRefusals, s.guardHost, s.requireReady, s.tagClient, s.limitBodies)
	e.GET("/", s.handleRoot)
	e.GET("/ws", s.chat.Handle)
	sub, _ := fs.Sub(uiFiles, "ui")
	e.GET("/ui/*", echo.WrapHandler(http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))))
	s.opsRoutes(e)
	for _, m := range s.mounts {
		m(e)
	}
}

func (s *Server) handleRoot(c echo.Context) error {
	if websocket.IsWebSocketUpgrade(c.Request()) {
		return s.chat.Handle(c)
	}
	page, err := uiFiles.ReadFile("ui/index.html")
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.HTMLBlob(http.StatusOK, page)
}

// anthropicOr serves a route shared by OpenAI's and Anthropic's APIs
// (GET /v1/models): Anthropic's clients get anthropic, the rest openAI.
func anthropicOr(openAI, anthropicH echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if anthropic.IsClient(c.Request()) {
			return anthropicH(c)
		}
		return openAI(c)
	}
}
