// Package embed serves embeddings and rerank over HTTP: OpenAI's
// POST /v1/embeddings, Ollama's /api/embed and older /api/embeddings, and
// POST /v1/rerank in the shape Jina's and Cohere's clients and llama-server
// use. It owns those wire types and the pure steps between them and a model:
// decoding and validating a request once, turning inputs into tokens through
// the model (truncating where the API asks), normalizing and shortening
// vectors, ordering rerank results, and encoding the reply.
//
// It knows nothing of routes, users or how the server words an error: a
// Lookup finds the model a request names (with the server's residency and
// access rules), and an ErrorWriter writes each error in its API's shape.
// Errors are *parley.Error values, so the server's one table maps them to
// statuses.
package embed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/parley-chat/parley"
)

// Model is a loaded embedding model or reranker. *llm.Engine is one.
type Model interface {
	// EmbedTokenize turns one input into tokens as the model's embeddings
	// want them (special tokens added).
	EmbedTokenize(ctx context.Context, text string) ([]int, error)
	// RerankTokens is a reranker's input for a query and a document.
	RerankTokens(ctx context.Context, query, doc string) ([]int, error)
	// Embed returns each input's pooled output, raw (not normalized): a
	// vector, or a reranker's score(s). client is the request's client
	// (parley.GenerateRequest.Client): the engine queues fairly between them.
	Embed(ctx context.Context, client string, inputs [][]int) ([][]float32, error)
}

// Pooling types (Info.Pooling), as llm names them.
const (
	PoolingMean = "mean"
	PoolingCLS  = "cls"
	PoolingLast = "last"
	PoolingRank = "rank"
)

// Info is what the handlers need to know of a model.
type Info struct {
	// Pooling is mean, cls, last or rank; "" for a model without pooling
	// (a chat model), which every endpoint here refuses.
	Pooling string
	// Dimensions is the length of one output.
	Dimensions int
	// MaxTokens is the most tokens one input may hold.
	MaxTokens int
}

// Target is the model a request names, found by Lookup.
type Target struct {
	Name  string // as replies show it
	Model Model
	Info  Info
	// Release, when set, is called once the request is done with Model
	// (a residency pin, say).
	Release func()
	// Client names the client the request comes from: the engine queues
	// fairly between clients (parley.Caller.Client).
	Client string
}

// Lookup finds the model named in a request ("" when the request named
// none); keepAlive is how long the request asks its model to stay loaded
// after it (nil: it did not ask). Its errors are written as they are (a
// *parley.Error with ENotFound, say).
type Lookup func(r *http.Request, model string, keepAlive *time.Duration) (Target, error)

// API names the wire an error is written for.
type API int

// The APIs whose errors look different.
const (
	APIOpenAI API = iota // /v1/embeddings
	APIOllama            // /api/embed, /api/embeddings
	APIRerank            // /v1/rerank (OpenAI-like error body)
)

// ErrorWriter writes err in api's error shape.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, api API, err error)

// Limits a Handler applies to every request.
const (
	// DefaultMaxInputs is the most inputs (or documents) one request may
	// hold: OpenAI's limit for /v1/embeddings.
	DefaultMaxInputs = 2048
	// DefaultMaxBody is the most bytes a request body may hold.
	DefaultMaxBody = 8 << 20
)

// Handler serves the endpoints. Safe for concurrent use.
type Handler struct {
	lookup    Lookup
	writeErr  ErrorWriter
	maxInputs int
	maxBody   int64
	keepAlive func(json.RawMessage) (time.Duration, bool, error)
}

// Option changes a Handler's limits.
type Option func(*Handler)

// WithMaxInputs sets the most inputs or documents per request (n > 0).
func WithMaxInputs(n int) Option { return func(h *Handler) { h.maxInputs = n } }

// WithMaxBody sets the most bytes a request body may hold (n > 0).
func WithMaxBody(n int64) Option { return func(h *Handler) { h.maxBody = n } }

// WithKeepAlive makes Ollama's endpoints honour a request's keep_alive:
// parse reads it (false when the request has none), and the request's
// Lookup is given it.
func WithKeepAlive(parse func(json.RawMessage) (time.Duration, bool, error)) Option {
	return func(h *Handler) { h.keepAlive = parse }
}

// New returns the handlers over lookup, writing errors with writeErr.
func New(lookup Lookup, writeErr ErrorWriter, opts ...Option) *Handler {
	h := &Handler{lookup: lookup, writeErr: writeErr, maxInputs: DefaultMaxInputs, maxBody: DefaultMaxBody}
	for _, o := range opts {
		o(h)
	}
	return h
}

// decode reads r's body, at most h.maxBody bytes, into v.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return parley.Errorf(parley.ETooLarge, "the request body is over %d bytes", h.maxBody)
	} else if err != nil {
		return parley.Errorf(parley.EInvalid, "read the request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return parley.Errorf(parley.EInvalid, "the request body is not valid JSON for this endpoint: %v", err)
	}
	return nil
}

// target looks up the model and checks that it pools as the endpoint
// needs: rank for rerank, anything else for embeddings.
func (h *Handler) target(r *http.Request, model string, rerank bool, keepAlive *time.Duration) (Target, error) {
	t, err := h.lookup(r, model, keepAlive)
	if err != nil {
		return Target{}, err
	}
	if t.Name == "" {
		t.Name = model
	}
	var bad error
	switch {
	case t.Info.Pooling == "":
		bad = parley.FieldErrorf("model", "%s is not an embedding model (its GGUF names no pooling type): it has no embeddings to give", t.Name)
	case rerank && t.Info.Pooling != PoolingRank:
		bad = parley.FieldErrorf("model", "%s is an embedding model (pooling %s), not a reranker: use /v1/embeddings", t.Name, t.Info.Pooling)
	case !rerank && t.Info.Pooling == PoolingRank:
		bad = parley.FieldErrorf("model", "%s is a reranker: use /v1/rerank", t.Name)
	}
	if bad != nil {
		t.release()
		return Target{}, bad
	}
	return t, nil
}

func (t Target) release() {
	if t.Release != nil {
		t.Release()
	}
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v) // a client that left is no error of ours
}

// fit checks each input against the model's most tokens per input: longer
// ones are cut to it when truncate is set (Ollama's default), refused
// otherwise, as the APIs refuse a prompt over the context window. It
// returns the tokens in all.
func fit(inputs [][]int, maxTokens int, truncate bool) (int, error) {
	total := 0
	for i, in := range inputs {
		if len(in) > maxTokens {
			if !truncate {
				return 0, parley.PromptTooLong(len(in), maxTokens,
					"input %d is %d tokens; this model takes at most %d per input", i, len(in), maxTokens)
			}
			inputs[i] = in[:maxTokens]
		}
		total += len(inputs[i])
	}
	return total, nil
}

// normalize scales v to unit length (Euclidean), as llama-server and
// Ollama normalize embeddings (llama.cpp's common_embd_normalize with 2: a
// double sum of float squares). A zero vector stays zero.
func normalize(v []float32) []float32 {
	sum := 0.0
	for _, x := range v {
		sum += float64(x * x)
	}
	sum = math.Sqrt(sum)
	scale := float32(0)
	if sum > 0 {
		scale = float32(1 / sum)
	}
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = x * scale
	}
	return out
}

// shorten keeps v's first dims values, then normalizes (dims 0: all), as
// OpenAI's and Ollama's dimensions parameter does: a Matryoshka-trained
// model's prefix is an embedding of its own once renormalized.
func shorten(v []float32, dims int) []float32 {
	if dims > 0 && dims < len(v) {
		v = v[:dims]
	}
	return normalize(v)
}

// checkDimensions validates a requested dimensions against the model's.
func checkDimensions(dims, model int) error {
	if dims < 0 || dims > model {
		return parley.FieldErrorf("dimensions", "must be between 1 and the model's %d, got %d", model, dims)
	}
	return nil
}

// evaluate is every endpoint's one path from inputs to pooled outputs: in's
// texts are tokenized as the model wants them (its token ids are taken as
// they are), each input is held to the model's most tokens per input (cut
// to it when truncate, refused otherwise) before the engine sees it, and
// all go to the engine in one Embed call, which batches them. It returns
// the raw outputs, in order, and the tokens evaluated.
func evaluate(ctx context.Context, t Target, in Input, truncate bool) ([][]float32, int, error) {
	inputs := in.Tokens
	if inputs == nil {
		inputs = make([][]int, len(in.Texts))
		for i, s := range in.Texts {
			toks, err := t.Model.EmbedTokenize(ctx, s)
			if err != nil {
				return nil, 0, fmt.Errorf("input %d: %w", i, err)
			}
			inputs[i] = toks
		}
	}
	tokens, err := fit(inputs, t.Info.MaxTokens, truncate)
	if err != nil {
		return nil, 0, err
	}
	raw, err := t.Model.Embed(ctx, t.Client, inputs)
	if err != nil {
		return nil, 0, err
	}
	return raw, tokens, nil
}
