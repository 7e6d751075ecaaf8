package embed

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/parley-chat/parley"
)

// OllamaEmbedRequest is POST /api/embed's body.
type OllamaEmbedRequest struct {
	Model string `json:"model"`
	// Input is a string or a list of strings (token ids are OpenAI's only).
	Input Input `json:"input"`
	// Truncate cuts an input over the model's limit to it (the default,
	// nil); false refuses it.
	Truncate   *bool          `json:"truncate,omitempty"`
	Dimensions int            `json:"dimensions,omitempty"`
	Options    map[string]any `json:"options,omitempty"` // accepted, not used: nothing samples
	// KeepAlive is how long the model stays loaded after the request
	// (WithKeepAlive parses it; the server's policy decides what it may do).
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
}

// OllamaEmbedResponse is /api/embed's reply: normalized vectors.
type OllamaEmbedResponse struct {
	Model           string      `json:"model"`
	Embeddings      [][]float32 `json:"embeddings"`
	TotalDuration   int64       `json:"total_duration,omitempty"` // nanoseconds
	LoadDuration    int64       `json:"load_duration,omitempty"`
	PromptEvalCount int         `json:"prompt_eval_count,omitempty"`
}

// OllamaEmbeddingsRequest is the older POST /api/embeddings' body: one
// prompt.
type OllamaEmbeddingsRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Options   map[string]any  `json:"options,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
}

// OllamaEmbeddingsResponse is /api/embeddings' reply: the vector as the
// model gives it, not normalized (as Ollama answers it).
type OllamaEmbeddingsResponse struct {
	Embedding []float64 `json:"embedding"`
}

// Validate checks the request against the handler's limits and the
// model's shape.
func (req *OllamaEmbedRequest) Validate(maxInputs int, info Info) error {
	if len(req.Input.Tokens) > 0 {
		return parley.FieldErrorf("input", "must be a string or a list of strings")
	}
	if n := req.Input.Len(); n > maxInputs {
		return parley.FieldErrorf("input", "holds %d inputs; at most %d per request", n, maxInputs)
	}
	return checkDimensions(req.Dimensions, info.Dimensions)
}

// OllamaEmbed serves POST /api/embed.
func (h *Handler) OllamaEmbed(w http.ResponseWriter, r *http.Request) {
	if err := h.ollamaEmbed(w, r); err != nil {
		h.writeErr(w, r, APIOllama, err)
	}
}

func (h *Handler) ollamaEmbed(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	var req OllamaEmbedRequest
	if err := h.decode(w, r, &req); err != nil {
		return err
	}
	keepAlive, err := h.keepAliveOf(req.KeepAlive)
	if err != nil {
		return err
	}
	t, err := h.target(r, req.Model, false, keepAlive)
	if err != nil {
		return err
	}
	defer t.release()
	if err := req.Validate(h.maxInputs, t.Info); err != nil {
		return err
	}
	// Ollama answers an empty input (or only empty strings) with no
	// embeddings; an empty string among others has one like any text.
	texts := req.Input.Texts
	if len(texts) == 1 && texts[0] == "" {
		texts = nil
	}
	resp := OllamaEmbedResponse{Model: t.Name, Embeddings: [][]float32{}}
	if len(texts) > 0 {
		raw, tokens, err := evaluate(r.Context(), t, Input{Texts: texts}, req.Truncate == nil || *req.Truncate)
		if err != nil {
			return err
		}
		resp.PromptEvalCount = tokens
		for _, v := range raw {
			resp.Embeddings = append(resp.Embeddings, shorten(v, req.Dimensions))
		}
	}
	resp.TotalDuration = time.Since(start).Nanoseconds()
	writeJSON(w, resp)
	return nil
}

// OllamaEmbeddings serves the older POST /api/embeddings.
func (h *Handler) OllamaEmbeddings(w http.ResponseWriter, r *http.Request) {
	if err := h.ollamaEmbeddings(w, r); err != nil {
		h.writeErr(w, r, APIOllama, err)
	}
}

func (h *Handler) ollamaEmbeddings(w http.ResponseWriter, r *http.Request) error {
	var req OllamaEmbeddingsRequest
	if err := h.decode(w, r, &req); err != nil {
		return err
	}
	keepAlive, err := h.keepAliveOf(req.KeepAlive)
	if err != nil {
		return err
	}
	t, err := h.target(r, req.Model, false, keepAlive)
	if err != nil {
		return err
	}
	defer t.release()
	resp := OllamaEmbeddingsResponse{Embedding: []float64{}}
	if req.Prompt != "" {
		raw, _, err := evaluate(r.Context(), t, Input{Texts: []string{req.Prompt}}, true)
		if err != nil {
			return err
		}
		for _, x := range raw[0] {
			resp.Embedding = append(resp.Embedding, float64(x))
		}
	}
	writeJSON(w, resp)
	return nil
}

// keepAliveOf is the request's keep_alive for the Lookup, which holds the
// model: as Ollama's chat does, a request may ask how long its model stays
// loaded after it. Without a parser (WithKeepAlive) or a keep_alive, nil.
func (h *Handler) keepAliveOf(raw json.RawMessage) (*time.Duration, error) {
	if h.keepAlive == nil || len(raw) == 0 {
		return nil, nil
	}
	d, set, err := h.keepAlive(raw)
	if err != nil || !set {
		return nil, err
	}
	return &d, nil
}
