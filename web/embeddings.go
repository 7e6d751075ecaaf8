package web

// Embeddings and rerank (WithEmbeddings): OpenAI's /v1/embeddings, Ollama's
// /api/embed and /api/embeddings, and rerank under the four paths
// llama-server answers it on. The handlers are package embed's; the server
// gives them the same middleware as chat (the key, the per-client tag that
// the engine's fair queue shares by, the body budget, readiness) and finds
// the model through EmbedModels, which holds it for the request the way a
// chat reply holds its model.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/embed"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/ollama"
)

// EmbedModels finds the embedding model or reranker a request names.
// router.Router and router.EngineRef implement it.
type EmbedModels interface {
	// EmbedModel holds the model name stands for (with several models its
	// served name, resolved; with one, the request's model field as sent,
	// possibly "") until the Target's Release. It loads the model when it
	// is not loaded, and refuses a model that is not an embedding model
	// without loading it where its header says so.
	// keepAlive is the request's (nil: none), applied as the server's
	// policy allows.
	EmbedModel(ctx context.Context, name string, keepAlive *time.Duration) (embed.Target, error)
}

// WithEmbeddings mounts the embedding and rerank endpoints over m. Without
// it Ollama's /api/embed and /api/embeddings answer 501 and the others 404.
func WithEmbeddings(m EmbedModels) Option { return func(s *Server) { s.embeds = m } }

// rerankPaths are the paths llama-server serves rerank on; Jina's and
// Cohere's clients post to /v1/rerank.
var rerankPaths = []string{"/v1/rerank", "/v1/reranking", "/rerank", "/reranking"}

// mountEmbed adds the endpoints to g, which RequireKey guards.
func (s *Server) mountEmbed(g *echo.Group) {
	h := embed.New(s.embedLookup, s.writeEmbedError, embed.WithMaxBody(apicore.MaxBodyBytes), embed.WithKeepAlive(ollama.ParseKeepAlive))
	g.POST("/v1/embeddings", echo.WrapHandler(http.HandlerFunc(h.OpenAIEmbeddings)))
	g.POST("/api/embed", echo.WrapHandler(http.HandlerFunc(h.OllamaEmbed)))
	g.POST("/api/embeddings", echo.WrapHandler(http.HandlerFunc(h.OllamaEmbeddings)))
	for _, p := range rerankPaths {
		g.POST(p, echo.WrapHandler(http.HandlerFunc(h.Rerank)))
	}
}

// embedLookup is the handlers' embed.Lookup: it refuses while the server
// loads or drains, resolves the model field as chat does (aliases and
// Ollama's :latest included; an unknown name is a 404 that names the
// models), and holds the model.
func (s *Server) embedLookup(r *http.Request, model string, keepAlive *time.Duration) (embed.Target, error) {
	if err := s.apiAvailable(); err != nil {
		return embed.Target{}, err
	}
	name := model
	if s.models != nil {
		n, err := s.core.ResolveModel(model)
		if err != nil {
			return embed.Target{}, err
		}
		if model == "" {
			n = s.embedDefault(n, slices.Contains(rerankPaths, r.URL.Path))
		}
		name = n
	}
	t, err := s.embeds.EmbedModel(r.Context(), name, keepAlive)
	t.Client = apicore.FactsOfRequest(r).Caller.Client
	return t, err
}

// writeEmbedError answers err as the API's family does: OpenAI's body and
// statuses for /v1/embeddings and rerank (llama-server answers rerank in
// OpenAI's shape), Ollama's for /api/. It counts the refusal and sets
// Retry-After as the server's error handler does for every other route.
func (s *Server) writeEmbedError(w http.ResponseWriter, r *http.Request, api embed.API, err error) {
	wire := openAIErrors
	if api == embed.APIOllama {
		wire = ollamaErrors
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client left: no one reads the answer, and it is no failure
		// of the server's.
		err = parley.Errorf(parley.EUnavailable, "the request was cancelled")
	}
	s.countRefusal(err)
	if parley.ErrorCode(err) == parley.EInternal {
		s.log.Error("request failed", zap.String("path", r.URL.Path), zap.Error(err))
	}
	if d := apicore.RetryAfterSeconds(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(d))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(wire.status(err))
	_ = json.NewEncoder(w).Encode(wire.body(err)) // a client that left is no error of ours
}

// embedDefault is the model a request that names none gets (llama-server's
// clients often name none): the default model when it fits the endpoint,
// else the one served model that does (a reranker for rerank, an embedding
// model otherwise), else the default, which the handlers then refuse with
// the reason.
func (s *Server) embedDefault(def string, rerank bool) string {
	fits := func(m ModelStatus) bool {
		p := m.Info.Pooling
		return p != "" && (p == embed.PoolingRank) == rerank
	}
	only := ""
	for _, m := range s.models.Models() {
		if !fits(m) {
			continue
		}
		if m.Name == def {
			return def
		}
		if only != "" {
			return def // more than one: the request must say which
		}
		only = m.Name
	}
	if only == "" {
		return def
	}
	return only
}
