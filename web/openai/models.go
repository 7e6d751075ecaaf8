package openai

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/parley-chat/parley"
)

type openAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *API) openAIModel() openAIModel {
	return openAIModel{ID: s.core.ModelName(context.Background()), Object: "model", Created: s.core.Mounted.Unix(), OwnedBy: "parley"}
}

// Models is GET /v1/models: the one loaded model.
func (s *API) Models(c echo.Context) error {
	return c.JSON(http.StatusOK, struct {
		Object string        `json:"object"`
		Data   []openAIModel `json:"data"`
	}{"list", []openAIModel{s.openAIModel()}})
}

// Model is GET /v1/models/{id}.
func (s *API) Model(c echo.Context) error {
	m := s.openAIModel()
	if c.Param("id") != m.ID {
		return parley.Errorf(parley.ENotFound, "no model %q: this server serves %q", c.Param("id"), m.ID)
	}
	return c.JSON(http.StatusOK, m)
}
