package embed

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"

	"github.com/parley-chat/parley"
)

// OpenAIRequest is POST /v1/embeddings' body.
type OpenAIRequest struct {
	Model string `json:"model"`
	Input Input  `json:"input"`
	// EncodingFormat is "float" (the default) or "base64": each vector as
	// its little-endian float32 bytes in standard base64, which the
	// official clients ask for by default and decode themselves.
	EncodingFormat string `json:"encoding_format,omitempty"`
	// Dimensions, when set, keeps each vector's first Dimensions values
	// (renormalized).
	Dimensions int    `json:"dimensions,omitempty"`
	User       string `json:"user,omitempty"`
}

// Input is OpenAI's input: a string, a list of strings, a list of token
// ids, or a list of such lists. Exactly one of Texts and Tokens is set.
type Input struct {
	Texts  []string
	Tokens [][]int
}

// UnmarshalJSON reads any of Input's four shapes.
func (in *Input) UnmarshalJSON(b []byte) error {
	*in = Input{}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		in.Texts = []string{s}
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return parley.FieldErrorf("input", "must be a string, a list of strings, a list of token ids or a list of such lists")
	}
	if len(items) == 0 {
		return nil
	}
	switch first := bytes.TrimSpace(items[0]); {
	case len(first) > 0 && first[0] == '"':
		return json.Unmarshal(b, &in.Texts)
	case len(first) > 0 && first[0] == '[':
		return json.Unmarshal(b, &in.Tokens)
	default:
		var ids []int
		if err := json.Unmarshal(b, &ids); err != nil {
			return err
		}
		in.Tokens = [][]int{ids}
		return nil
	}
}

// Len is how many inputs in holds.
func (in Input) Len() int { return len(in.Texts) + len(in.Tokens) }

// OpenAIResponse is /v1/embeddings' reply.
type OpenAIResponse struct {
	Object string            `json:"object"` // "list"
	Data   []OpenAIEmbedding `json:"data"`
	Model  string            `json:"model"`
	Usage  OpenAIUsage       `json:"usage"`
}

// OpenAIEmbedding is one input's vector: Embedding is a []float32 or, for
// encoding_format base64, a string.
type OpenAIEmbedding struct {
	Object    string `json:"object"` // "embedding"
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

// OpenAIUsage counts the inputs' tokens.
type OpenAIUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// Validate checks the request against the handler's limits and the
// model's shape.
func (req *OpenAIRequest) Validate(maxInputs int, info Info) error {
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		return parley.FieldErrorf("encoding_format", "must be float or base64, got %q", req.EncodingFormat)
	}
	n := req.Input.Len()
	if n == 0 {
		return parley.FieldErrorf("input", "must not be empty")
	}
	if n > maxInputs {
		return parley.FieldErrorf("input", "holds %d inputs; at most %d per request", n, maxInputs)
	}
	for _, s := range req.Input.Texts {
		if s == "" {
			return parley.FieldErrorf("input", "must not hold an empty string")
		}
	}
	for _, t := range req.Input.Tokens {
		if len(t) == 0 {
			return parley.FieldErrorf("input", "must not hold an empty list of token ids")
		}
	}
	return checkDimensions(req.Dimensions, info.Dimensions)
}

// NewOpenAIResponse encodes raw pooled outputs as /v1/embeddings answers
// them: each normalized to unit length (shortened first to dims when set),
// as floats or base64.
func NewOpenAIResponse(model string, raw [][]float32, dims int, format string, tokens int) OpenAIResponse {
	resp := OpenAIResponse{Object: "list", Model: model, Data: make([]OpenAIEmbedding, len(raw)),
		Usage: OpenAIUsage{PromptTokens: tokens, TotalTokens: tokens}}
	for i, v := range raw {
		var e any = shorten(v, dims)
		if format == "base64" {
			e = Base64(e.([]float32))
		}
		resp.Data[i] = OpenAIEmbedding{Object: "embedding", Index: i, Embedding: e}
	}
	return resp
}

// Base64 is v as OpenAI's base64 encoding: little-endian float32 bytes.
func Base64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// OpenAIEmbeddings serves POST /v1/embeddings.
func (h *Handler) OpenAIEmbeddings(w http.ResponseWriter, r *http.Request) {
	if err := h.openAI(w, r); err != nil {
		h.writeErr(w, r, APIOpenAI, err)
	}
}

func (h *Handler) openAI(w http.ResponseWriter, r *http.Request) error {
	var req OpenAIRequest
	if err := h.decode(w, r, &req); err != nil {
		return err
	}
	t, err := h.target(r, req.Model, false, nil)
	if err != nil {
		return err
	}
	defer t.release()
	if err := req.Validate(h.maxInputs, t.Info); err != nil {
		return err
	}
	raw, tokens, err := evaluate(r.Context(), t, req.Input, false)
	if err != nil {
		return err
	}
	writeJSON(w, NewOpenAIResponse(t.Name, raw, req.Dimensions, req.EncodingFormat, tokens))
	return nil
}
