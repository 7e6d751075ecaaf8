package ollama

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// POST /api/show: what a client reads before it chats. VS Code's Ollama
// provider reads capabilities (it offers a model for agent mode only with
// "tools") and model_info's "<architecture>.context_length".

type ollamaShowRequest struct {
	Model   string `json:"model"`
	Name    string `json:"name"` // the older name of model
	Verbose bool   `json:"verbose"`
}

type ollamaShowResponse struct {
	License      string         `json:"license"`
	Modelfile    string         `json:"modelfile"`
	Parameters   string         `json:"parameters"`
	Template     string         `json:"template"`
	System       string         `json:"system,omitempty"`
	Details      ollamaDetails  `json:"details"`
	ModelInfo    map[string]any `json:"model_info"`
	Capabilities []string       `json:"capabilities"`
	ModifiedAt   string         `json:"modified_at"`
	// Tensors is always empty: Parley does not list the model's tensors.
	Tensors []struct{} `json:"tensors"`
}

func (s *API) Show(c echo.Context) error {
	body, err := apicore.ReadBody(c)
	if err != nil {
		return err
	}
	var req ollamaShowRequest
	if err := decodeOllama(body, &req); err != nil {
		return err
	}
	field := "model"
	if req.Model == "" && req.Name != "" {
		req.Model, field = req.Name, "name"
	}
	model, err := s.checkOllamaModel(req.Model, field)
	if err != nil {
		return err
	}
	info := s.loadedModel(model)
	mod, _ := ollamaFileFacts(info)
	name := s.ollamaModelName(model)
	from := info.Path
	if !s.core.Operator(c.Request()) {
		from = baseName(from) // where the model lives is the operator's business
	}
	return c.JSON(http.StatusOK, ollamaShowResponse{
		Modelfile:    fmt.Sprintf("# Served by Parley from %s\nFROM %s\n", name, from),
		Parameters:   s.ollamaParameters(model),
		Template:     info.ChatTemplate,
		Details:      ollamaDetailsOf(info),
		ModelInfo:    ollamaModelInfo(info),
		Capabilities: s.ollamaCapabilities(model),
		ModifiedAt:   mod.UTC().Format("2006-01-02T15:04:05.999999999Z07:00"),
		Tensors:      []struct{}{},
	})
}

// ollamaModelInfo is the GGUF metadata the engine read, under GGUF's keys.
func ollamaModelInfo(info parley.ModelInfo) map[string]any {
	m := map[string]any{
		"general.architecture":    info.Architecture,
		"general.name":            info.Name,
		"general.parameter_count": info.Parameters,
		"general.file_type_name":  info.Quantization,
	}
	if a := info.Architecture; a != "" {
		m[a+".context_length"] = info.TrainContext
		m[a+".embedding_length"] = info.EmbeddingLength
		m[a+".block_count"] = info.Layers
		m[a+".vocab_size"] = info.VocabSize
	}
	return m
}

// ollamaParameters are the server's sampling defaults in a Modelfile's
// PARAMETER syntax, under Ollama's option names, with the context a
// conversation gets (num_ctx).
func (s *API) ollamaParameters(model string) string {
	d := s.core.Defaults
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%-30s %s\n", k, v) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	line("num_ctx", strconv.Itoa(s.loadedModel(model).ContextLength))
	line("num_predict", strconv.Itoa(d.MaxTokens))
	line("temperature", f(d.Temperature))
	line("top_k", strconv.Itoa(d.TopK))
	line("top_p", f(d.TopP))
	line("min_p", f(d.MinP))
	line("typical_p", f(d.TypicalP))
	line("repeat_penalty", f(d.RepeatPenalty))
	line("repeat_last_n", strconv.Itoa(d.RepeatLastN))
	for _, st := range d.Stop {
		line("stop", apicore.JSONString(st))
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// ollamaCapabilities are what the model does through Parley: completion
// always, tools when its chat template takes them (as Ollama decides:
// Parley could constrain any model to a call, but one not trained for
// tools calls them at random), thinking when it marks a thought Parley
// splits from the answer, vision when it was loaded with a projector. An
// embedding model or reranker (a pooling type in its GGUF) has embedding
// alone, as Ollama reports one.
func (s *API) ollamaCapabilities(model string) []string {
	if s.loadedModel(model).Pooling != "" {
		return []string{"embedding"}
	}
	caps := []string{"completion"}
	if strings.Contains(s.loadedModel(model).ChatTemplate, "tools") {
		caps = append(caps, "tools")
	}
	if s.ollamaThinks(model) {
		caps = append(caps, "thinking")
	}
	if s.loadedModel(model).Vision {
		caps = append(caps, "vision")
	}
	return caps
}

// baseName is what a request that is not the operator's sees of a model's
// path.
func baseName(path string) string {
	if path == "" {
		return ""
	}
	return filepath.Base(path)
}
