package anthropic

import (
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/parley-chat/parley"
)

// anthropicModel is Anthropic's model object.
type anthropicModel struct {
	Type        string `json:"type"` // "model"
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"` // RFC 3339
}

// anthropicModels are the served models in Anthropic's shape: every model
// of a server with several (--models), else the one loaded.
func (s *API) anthropicModels() []anthropicModel {
	created := s.core.Mounted.UTC().Format(time.RFC3339)
	one := func(name string) anthropicModel {
		return anthropicModel{Type: "model", ID: name, DisplayName: name, CreatedAt: created}
	}
	if s.core.Models == nil {
		return []anthropicModel{one(s.core.ModelName(""))}
	}
	var out []anthropicModel
	for _, m := range s.core.Models.Models() {
		out = append(out, one(m.Name))
	}
	return out
}

// Models is GET /v1/models for Anthropic's clients: the
// served models, as one page.
func (s *API) Models(c echo.Context) error {
	ms := s.anthropicModels()
	page := struct {
		Data    []anthropicModel `json:"data"`
		HasMore bool             `json:"has_more"`
		FirstID *string          `json:"first_id"`
		LastID  *string          `json:"last_id"`
	}{Data: ms}
	if len(ms) > 0 {
		page.FirstID, page.LastID = &ms[0].ID, &ms[len(ms)-1].ID
	}
	return c.JSON(http.StatusOK, page)
}

// Model is GET /v1/models/{id} for Anthropic's clients.
func (s *API) Model(c echo.Context) error {
	ms := s.anthropicModels()
	names := make([]string, len(ms))
	for i, m := range ms {
		if m.ID == c.Param("id") {
			return c.JSON(http.StatusOK, m)
		}
		names[i] = m.ID
	}
	return parley.Errorf(parley.ENotFound, "no model %q: this server serves %s", c.Param("id"), strings.Join(names, ", "))
}
