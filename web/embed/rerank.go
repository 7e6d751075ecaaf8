package embed

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/parley-chat/parley"
)

// RerankRequest is POST /v1/rerank's body, in the shape Jina's and
// Cohere's clients and llama-server send.
type RerankRequest struct {
	Model     string     `json:"model"`
	Query     string     `json:"query"`
	Documents []Document `json:"documents"`
	// TopN, when positive, keeps the TopN best results.
	TopN            int  `json:"top_n,omitempty"`
	ReturnDocuments bool `json:"return_documents,omitempty"`
}

// Document is one document: a string, or an object with its text (Cohere's
// older {"text": ...}).
type Document struct {
	Text string `json:"text"`
}

// UnmarshalJSON reads a string or an object with a text field.
func (d *Document) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &d.Text)
	}
	var o struct {
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(b, &o); err != nil || o.Text == nil {
		return parley.FieldErrorf("documents", "each document must be a string or an object with a text")
	}
	d.Text = *o.Text
	return nil
}

// RerankResponse is /v1/rerank's reply: the documents' scores, best first.
type RerankResponse struct {
	Model   string         `json:"model"`
	Object  string         `json:"object"` // "list"
	Usage   OpenAIUsage    `json:"usage"`
	Results []RerankResult `json:"results"`
}

// RerankResult is one document's score. RelevanceScore is the reranker's
// output as it gives it (a logit: higher is more relevant), as llama-server
// answers it.
type RerankResult struct {
	Index          int       `json:"index"`
	RelevanceScore float64   `json:"relevance_score"`
	Document       *Document `json:"document,omitempty"`
}

// Validate checks the request against the handler's limits.
func (req *RerankRequest) Validate(maxInputs int) error {
	switch {
	case req.Query == "":
		return parley.FieldErrorf("query", "must not be empty")
	case len(req.Documents) == 0:
		return parley.FieldErrorf("documents", "must be a non-empty list")
	case len(req.Documents) > maxInputs:
		return parley.FieldErrorf("documents", "holds %d documents; at most %d per request", len(req.Documents), maxInputs)
	case req.TopN < 0:
		return parley.FieldErrorf("top_n", "must not be negative")
	}
	return nil
}

// NewRerankResponse orders the documents by score, best first (ties in
// the documents' order), keeping the topN best when topN > 0.
func NewRerankResponse(model string, req RerankRequest, scores []float32, tokens int) RerankResponse {
	resp := RerankResponse{Model: model, Object: "list", Usage: OpenAIUsage{PromptTokens: tokens, TotalTokens: tokens},
		Results: make([]RerankResult, len(scores))}
	for i, s := range scores {
		resp.Results[i] = RerankResult{Index: i, RelevanceScore: float64(s)}
		if req.ReturnDocuments {
			resp.Results[i].Document = &Document{Text: req.Documents[i].Text}
		}
	}
	slices.SortStableFunc(resp.Results, func(a, b RerankResult) int {
		switch {
		case a.RelevanceScore > b.RelevanceScore:
			return -1
		case a.RelevanceScore < b.RelevanceScore:
			return 1
		}
		return 0
	})
	if req.TopN > 0 && req.TopN < len(resp.Results) {
		resp.Results = resp.Results[:req.TopN]
	}
	return resp
}

// Rerank serves POST /v1/rerank.
func (h *Handler) Rerank(w http.ResponseWriter, r *http.Request) {
	if err := h.rerank(w, r); err != nil {
		h.writeErr(w, r, APIRerank, err)
	}
}

func (h *Handler) rerank(w http.ResponseWriter, r *http.Request) error {
	var req RerankRequest
	if err := h.decode(w, r, &req); err != nil {
		return err
	}
	if err := req.Validate(h.maxInputs); err != nil {
		return err
	}
	t, err := h.target(r, req.Model, true, nil)
	if err != nil {
		return err
	}
	defer t.release()
	inputs := make([][]int, len(req.Documents))
	for i, d := range req.Documents {
		if inputs[i], err = t.Model.RerankTokens(r.Context(), req.Query, d.Text); err != nil {
			return err
		}
	}
	raw, tokens, err := evaluate(r.Context(), t, Input{Tokens: inputs}, false)
	if err != nil {
		return err
	}
	scores := make([]float32, len(raw))
	for i, v := range raw {
		if len(v) > 0 {
			scores[i] = v[0]
		}
	}
	writeJSON(w, NewRerankResponse(t.Name, req, scores, tokens))
	return nil
}
