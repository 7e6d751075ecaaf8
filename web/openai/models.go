package openai

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/parley-chat/parley"
)

type openAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Capabilities says what the model takes besides text, in Ollama's words: ["vision"] for a model with a
	// projector (OpenAI's model object has no such field; clients that do not know it ignore it).
	Capabilities []string `json:"capabilities,omitempty"`
}

func (s *API) openAIModel() openAIModel {
	m := openAIModel{ID: s.core.ModelName(""), Object: "model", Created: s.core.Mounted.Unix(), OwnedBy: "parley"}
	if _, info := s.core.ModelFor(""); info.Vision {
		m.Capabilities = []string{"vision"}
	}
	return m
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
