package web

// Several models in one server (WithModels): the request's model field (or
// a WebSocket's ?model=) picks the model (apicore.Core.ResolveModel), and the
// operator lists, loads and unloads them here.
//
//	GET  /v1/models                       every model, its state, size and settings
//	POST /admin/models/{name}/load        load a model now (the API key; 403 without --api-key)
//	POST /admin/models/{name}/unload      unload it (or when its replies end)

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// WithModels makes the server serve several models (see Models); r must
// route by the request's model (parley.ReplyRequest.Model).
func WithModels(m Models) Option { return func(s *Server) { s.models = m } }

// modelsList is /v1/models with several models: OpenAI's list, each entry
// with Parley's state, size and settings besides.
type modelsListEntry struct {
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	ModelStatus
}

func (s *Server) modelsListEntry(m ModelStatus) modelsListEntry {
	return modelsListEntry{Object: "model", Created: s.core.Mounted.Unix(), OwnedBy: "parley", ModelStatus: m}
}

func (s *Server) handleModelsList(c echo.Context) error {
	ms := s.modelsFor(c.Request(), s.models.Models())
	data := make([]modelsListEntry, 0, len(ms))
	for _, m := range ms {
		data = append(data, s.modelsListEntry(m))
	}
	return c.JSON(http.StatusOK, struct {
		Object string            `json:"object"`
		Data   []modelsListEntry `json:"data"`
	}{"list", data})
}

func (s *Server) handleModelsOne(c echo.Context) error {
	name, err := s.models.Resolve(c.Param("id"))
	if err != nil {
		return err
	}
	m, _ := s.core.ModelStatusOf(name)
	if !s.operator(c.Request()) {
		m = redactStatus(m)
	}
	return c.JSON(http.StatusOK, s.modelsListEntry(m))
}

// mountAdmin adds the admin endpoints. They need the API key (--api-key):
// a server started without it refuses them (403), since loading and
// unloading models is not for whoever can reach the port, and so does one
// whose request came with a named user's key (--user), which reaches that
// user's conversations, not the server's models.
func (s *Server) mountAdmin(g *echo.Group) {
	g.POST("/admin/models/:name/load", s.handleAdminLoad)
	g.POST("/admin/models/:name/unload", s.handleAdminUnload)
}

func (s *Server) adminAllowed(c echo.Context) error {
	if s.cfg.APIKey == "" {
		return parley.Errorf(parley.EForbidden, "the admin endpoints need an API key: start the server with --api-key")
	}
	if apicore.FactsOf(c).Caller.User != "" {
		return parley.Errorf(parley.EForbidden, "the admin endpoints need the server's --api-key, not a user's key")
	}
	return s.core.Available()
}

func (s *Server) handleAdminLoad(c echo.Context) error {
	if err := s.adminAllowed(c); err != nil {
		return err
	}
	name, err := s.models.Resolve(c.Param("name"))
	if err != nil {
		return err
	}
	start := time.Now()
	if err := s.models.Load(c.Request().Context(), name); err != nil {
		return err
	}
	s.log.Info("model loaded by admin", zap.String("model", name), zap.Duration("took", time.Since(start)))
	m, _ := s.core.ModelStatusOf(name)
	return c.JSON(http.StatusOK, m)
}

func (s *Server) handleAdminUnload(c echo.Context) error {
	if err := s.adminAllowed(c); err != nil {
		return err
	}
	name, err := s.models.Resolve(c.Param("name"))
	if err != nil {
		return err
	}
	if err := s.models.Unload(name); err != nil {
		return err
	}
	s.log.Info("model unloaded by admin", zap.String("model", name))
	m, _ := s.core.ModelStatusOf(name)
	return c.JSON(http.StatusOK, m)
}
