package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
)

// remote posts to a server's OpenAI-compatible /v1/embeddings, or to its
// /v1/rerank for a reranker (Parley's and llama-server's take the same
// request).
type remote struct {
	url, model, key string
	rerank          bool
	client          *http.Client
}

func newRemote(base, model, key string, rerank bool, client *http.Client) *remote {
	path := "/v1/embeddings"
	if rerank {
		path = "/v1/rerank"
	}
	return &remote{url: strings.TrimRight(base, "/") + path, model: model, key: key, rerank: rerank, client: client}
}

func (r *remote) embed(ctx context.Context, _, text string, n int) (int, error) {
	inputs := make([]string, n)
	for i := range inputs {
		inputs[i] = text
	}
	tokens, _, err := r.post(ctx, inputs, false)
	return tokens, err
}

// count is the tokens the server counts for text, or tooManyTokens when it
// refuses text as too long.
func (r *remote) count(ctx context.Context, text string) (int, error) {
	tokens, _, err := r.post(ctx, []string{text}, false)
	var long *tooLong
	if errors.As(err, &long) {
		return tooManyTokens, nil
	}
	return tokens, err
}

// tooManyTokens is the count of a text that the server refuses as too long.
const tooManyTokens = math.MaxInt32

func (r *remote) outputs(ctx context.Context, texts []string) ([][]float32, error) {
	_, out, err := r.post(ctx, texts, true)
	return out, err
}

// tooLong is a refusal that says the input is over the model's limit
// (Parley: 400 context_length_exceeded; llama-server: "too large").
type tooLong struct{ msg string }

func (e *tooLong) Error() string { return e.msg }

// post sends texts (the inputs, or the documents for rerankQuery) and
// returns the prompt tokens the server counted and, when decode is set,
// each text's output in the texts' order (embeddings, or scores as vectors
// of one). Without decode only the number of outputs is checked: a
// measurement's client work stays small beside the server's.
func (r *remote) post(ctx context.Context, texts []string, decode bool) (int, [][]float32, error) {
	req := map[string]any{"model": r.model, "input": texts, "encoding_format": "float"}
	if r.rerank {
		req = map[string]any{"model": r.model, "query": rerankQuery, "documents": texts}
	}
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if r.key != "" {
		hreq.Header.Set("Authorization", "Bearer "+r.key)
	}
	resp, err := r.client.Do(hreq)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusOK && (bytes.Contains(b, []byte("context_length_exceeded")) || bytes.Contains(b, []byte("too large"))) {
		return 0, nil, &tooLong{string(b)}
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var usage struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &usage); err != nil {
		return 0, nil, fmt.Errorf("reply: %w", err)
	}
	if r.rerank {
		var out struct {
			Results []struct {
				Index int     `json:"index"`
				Score float32 `json:"relevance_score"`
			} `json:"results"`
		}
		if err := json.Unmarshal(b, &out); err != nil || len(out.Results) != len(texts) {
			return 0, nil, fmt.Errorf("reply of %d scores for %d documents: %v", len(out.Results), len(texts), err)
		}
		if !decode {
			return usage.Usage.PromptTokens, nil, nil
		}
		scores := make([][]float32, len(texts))
		for _, res := range out.Results {
			if res.Index < 0 || res.Index >= len(texts) || scores[res.Index] != nil {
				return 0, nil, fmt.Errorf("reply: index %d out of range or repeated", res.Index)
			}
			scores[res.Index] = []float32{res.Score}
		}
		return usage.Usage.PromptTokens, scores, nil
	}
	if !decode {
		var out struct {
			Data []json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(b, &out); err != nil || len(out.Data) != len(texts) {
			return 0, nil, fmt.Errorf("reply of %d embeddings for %d inputs: %v", len(out.Data), len(texts), err)
		}
		return usage.Usage.PromptTokens, nil, nil
	}
	var out struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Data) != len(texts) {
		return 0, nil, fmt.Errorf("reply of %d embeddings for %d inputs: %v", len(out.Data), len(texts), err)
	}
	vecs := make([][]float32, len(texts))
	for _, d := range out.Data {
		if d.Index < 0 || d.Index >= len(texts) || vecs[d.Index] != nil {
			return 0, nil, fmt.Errorf("reply: index %d out of range or repeated", d.Index)
		}
		vecs[d.Index] = d.Embedding
	}
	return usage.Usage.PromptTokens, vecs, nil
}
