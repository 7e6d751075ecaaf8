package llm

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/parley-chat/parley"
)

// Embedding models. A GGUF whose metadata names a pooling type
// (<arch>.pooling_type: mean, CLS, last or rank) opens as an embedding
// model: its context computes pooled embeddings instead of logits, its loop
// (embedloop.go) evaluates inputs in batches instead of generating, and it
// serves Embed, not Generate. A model without one (a chat model) serves
// Generate and refuses Embed, as llama-server refuses embeddings of a model
// without pooling.

// DefaultEmbedSequences is an embedding model's Config.CacheSlots when it
// is not set: the inputs one batch holds at most (llama.cpp sequences). A
// batch is one micro-batch of Config.BatchSize tokens, so 16 short inputs
// (a sentence is 10 to 30 tokens) share one pass over the weights. A
// causal embedding model keeps ContextLength tokens of KV cache for each,
// which applyDefaults caps at BatchSize, the longest input.
const DefaultEmbedSequences = 16

// archHasKV reports whether llama.cpp gives a model of architecture arch
// a KV cache: it gives none to encoders (BERT and its kin, the
// gemma-embedding encoder) and to diffusion models, which see their whole
// input in one pass (llama_model::create_memory, in both engines'
// llama.cpp). Every other architecture keeps n_ctx tokens of K and V per
// layer, an embedding model as much as a chat model.
func archHasKV(arch string) bool {
	switch arch {
	case "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert",
		"gemma-embedding", "wavtokenizer-dec", "dream", "llada", "llada-moe", "rnd1":
		return false
	}
	return true
}

// Pooling types, as the API names them.
const (
	PoolingMean = "mean"
	PoolingCLS  = "cls"
	PoolingLast = "last"
	PoolingRank = "rank" // a reranker: one score per (query, document) input
)

// llama.cpp's enum llama_pooling_type.
const (
	poolingNone = 0
	poolingMean = 1
	poolingCLS  = 2
	poolingLast = 3
	poolingRank = 4
)

var poolingNames = map[int]string{poolingMean: PoolingMean, poolingCLS: PoolingCLS, poolingLast: PoolingLast, poolingRank: PoolingRank}

// embedMeta is what the GGUF says about embeddings.
type embedMeta struct {
	pooling int  // llama.cpp's pooling type; poolingNone when the metadata names none
	causal  bool // <arch>.attention.causal (default true); false: an encoder, which sees a whole input at once
}

func readEmbedMeta(kv ggml.KV) embedMeta {
	m := embedMeta{causal: true}
	arch := kv.Architecture()
	switch v := kv.Value(arch + ".pooling_type").(type) {
	case uint32:
		m.pooling = int(v)
	case int32:
		m.pooling = int(v)
	}
	if _, ok := poolingNames[m.pooling]; !ok {
		m.pooling = poolingNone // an unknown type is left to llama.cpp's own check: not an embedding model here
	}
	if c, ok := kv.Value(arch + ".attention.causal").(bool); ok {
		m.causal = c
	}
	return m
}

// EmbedInfo describes what an engine's Embed gives.
type EmbedInfo struct {
	// Pooling is PoolingMean, PoolingCLS, PoolingLast or PoolingRank; ""
	// for a chat model, which has no embeddings to give.
	Pooling string
	// Dimensions is how many values Embed returns per input: the
	// embedding length, or for a reranker its classifier's outputs (one
	// score, usually).
	Dimensions int
	// MaxTokens is the most tokens one input may hold: the micro-batch
	// (an encoder sees a whole input in one; llama.cpp aborts the process
	// on a longer one) and the context per sequence, whichever is less.
	MaxTokens int
	// Causal is false for an encoder (BERT-style) model.
	Causal bool
}

// embedState is an embedding engine's fixed shape (nil on a chat engine).
type embedState struct {
	be      embedBackend
	info    EmbedInfo
	pooling int // llama.cpp's pooling type of the context
	seqs    int // sequences per batch at most (the context's n_seq_max)
	// rerank is how a (query, document) pair becomes one input.
	rerank rerankFormat
}

// embedBackend is what the embedding loop needs of a backend beyond
// backend: both engines implement it (embed_embedded.go, embed_current.go).
// Only the loop's goroutine calls embedDecode and seqEmbedding.
type embedBackend interface {
	// embedShape is the context's pooling type (llama.cpp's enum) and how
	// many values one sequence's pooled output holds.
	embedShape() (pooling, n int)
	// specialTokens are the vocabulary's BOS, EOS and SEP (-1: none) and
	// whether tokenizing with special tokens adds each.
	specialTokens() specialTokens
	// embedDecode clears the KV cache (when the model has one) and
	// evaluates b, whose every row is an output and whose tokens fit one
	// micro-batch.
	embedDecode(b *batch) error
	// seqEmbedding copies seq's pooled output after embedDecode (n values;
	// nil when llama.cpp has none for seq).
	seqEmbedding(seq, n int) []float32
	// contextShape is what llama.cpp opened: its context's tokens over all
	// sequences (n_ctx), its sequences (n_seq_max), and whether it keeps a
	// KV cache (an encoder has none). Inspect's estimate must match it.
	contextShape() (nCtx, seqs int, kv bool)
}

type specialTokens struct {
	bos, eos, sep          int
	addBOS, addEOS, addSEP bool
}

// rerankFormat builds a reranker's input from a query and a document, as
// llama-server does (format_prompt_rerank): the model's "rerank" template
// with {query} and {document} replaced, tokenized with special-token text
// parsed and nothing added; else BOS (when the vocabulary adds it), the
// query, EOS (when it adds EOS; SEP when it has no EOS), SEP (when it adds
// SEP), the document, EOS.
type rerankFormat struct {
	template string
	special  specialTokens
}

func (e *Engine) openEmbed(meta metadata, cfg Config) error {
	eb, ok := e.be.(embedBackend)
	if !ok {
		return fmt.Errorf("the %s engine cannot compute embeddings", e.be.Name())
	}
	pooling, n := eb.embedShape()
	if pooling == poolingNone {
		return fmt.Errorf("embedding model %s: its GGUF names pooling %s, which the %s engine's llama.cpp does not read for the %s architecture (the current engine does: --engine current)",
			cfg.Path, poolingNames[meta.embed.pooling], e.be.Name(), meta.info.Architecture)
	}
	name, ok := poolingNames[pooling]
	if !ok || n <= 0 {
		return fmt.Errorf("embedding model %s: llama.cpp's context has pooling type %d and %d outputs per input: not one Parley serves", cfg.Path, pooling, n)
	}
	e.emb = &embedState{
		be:      eb,
		pooling: pooling,
		seqs:    cfg.CacheSlots,
		info:    EmbedInfo{Pooling: name, Dimensions: n, MaxTokens: min(cfg.BatchSize, cfg.ContextLength), Causal: meta.embed.causal},
		rerank:  rerankFormat{template: meta.info.ChatTemplates["rerank"], special: eb.specialTokens()},
	}
	return nil
}

// errNotEmbedding is Embed's error on a chat model.
func (e *Engine) errNotEmbedding() error {
	return parley.Errorf(parley.EInvalid, "model %s is not an embedding model: its GGUF names no pooling type (%s.pooling_type), so it has no embeddings to give; "+
		"load an embedding or reranker model beside it", e.info.Name, e.info.Architecture)
}

// errEmbeddingOnly is Generate's error on an embedding model.
func (e *Engine) errEmbeddingOnly() error {
	return parley.Errorf(parley.EInvalid, "model %s is an embedding model (pooling %s): it serves embeddings, not chat or completions",
		e.info.Name, e.emb.info.Pooling)
}

// EmbedInfo describes the engine's embeddings (Pooling "" on a chat model).
func (e *Engine) EmbedInfo() EmbedInfo {
	if e.emb == nil {
		return EmbedInfo{}
	}
	return e.emb.info
}

// EmbedTokenize turns one embedding input into tokens as llama-server
// does: special tokens added as the vocabulary wants (BOS/CLS, and EOS/SEP
// where it adds them), special-token text parsed.
func (e *Engine) EmbedTokenize(ctx context.Context, text string) ([]int, error) {
	if e.emb == nil {
		return nil, e.errNotEmbedding()
	}
	toks, err := e.tokenize(ctx, text, true, true, 0)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return toks, nil
}

// RerankTokens is the input of a reranker for query and doc (see
// rerankFormat). The model must pool with rank.
func (e *Engine) RerankTokens(ctx context.Context, query, doc string) ([]int, error) {
	if e.emb == nil {
		return nil, e.errNotEmbedding()
	}
	if e.emb.pooling != poolingRank {
		return nil, parley.Errorf(parley.EInvalid, "model %s is not a reranker: it pools with %s, not rank", e.info.Name, e.emb.info.Pooling)
	}
	f := e.emb.rerank
	if f.template != "" {
		p := strings.ReplaceAll(f.template, "{query}", query)
		p = strings.ReplaceAll(p, "{document}", doc)
		return e.tokenize(ctx, p, false, true, 0)
	}
	q, err := e.tokenize(ctx, query, false, false, 0)
	if err != nil {
		return nil, err
	}
	d, err := e.tokenize(ctx, doc, false, false, 0)
	if err != nil {
		return nil, err
	}
	return f.join(q, d), nil
}

// join lays out a query's and a document's tokens (see rerankFormat).
func (f rerankFormat) join(q, d []int) []int {
	s := f.special
	eos := s.eos
	if eos < 0 {
		eos = s.sep
	}
	out := make([]int, 0, len(q)+len(d)+4)
	if s.addBOS && s.bos >= 0 {
		out = append(out, s.bos)
	}
	out = append(out, q...)
	if s.addEOS && eos >= 0 {
		out = append(out, eos)
	}
	if s.addSEP && s.sep >= 0 {
		out = append(out, s.sep)
	}
	out = append(out, d...)
	if s.addEOS && eos >= 0 {
		out = append(out, eos)
	}
	return out
}

// embedJob is one Embed call in the loop: its inputs, and their outputs as
// they come.
type embedJob struct {
	inputs [][]int
	out    [][]float32
	next   int              // inputs handed to a batch so far
	done   int              // inputs with an output
	tokens int              // tokens evaluated
	res    chan embedResult // 1-buffered; the loop answers once
	// answered: res has the answer (owned by the loop).
	answered bool
}

type embedResult struct {
	out [][]float32
	err error
}

// Embed evaluates inputs (token lists, as EmbedTokenize or RerankTokens
// make them) and returns each one's pooled output, raw: the API layer
// normalizes. Inputs go through the loop in batches beside other clients'
// requests, in the same fair queue as chat requests (fairqueue.go): one
// call is one queued request, and the loop serves the calls it holds round
// robin, an input at a time, so a call of many inputs does not hold back
// another client's call of one. client is the call's client, as
// GenerateRequest.Client is a reply's.
//
// Errors (as *parley.Error): EInvalid for an empty input, a token outside
// the vocabulary, or a chat model; ETooLarge for an input over
// EmbedInfo().MaxTokens; EBusy when the queue is full; EUnavailable after
// Close. Cancelling ctx ends the call within one batch.
func (e *Engine) Embed(ctx context.Context, client string, inputs [][]int) ([][]float32, error) {
	if e.emb == nil {
		return nil, e.errNotEmbedding()
	}
	if len(inputs) == 0 {
		return nil, parley.FieldErrorf("input", "must not be empty")
	}
	for i, in := range inputs {
		if len(in) == 0 {
			return nil, parley.FieldErrorf("input", "input %d has no tokens", i)
		}
		if len(in) > e.emb.info.MaxTokens {
			return nil, parley.PromptTooLong(len(in), e.emb.info.MaxTokens,
				"input %d is %d tokens; this embedding model takes at most %d per input", i, len(in), e.emb.info.MaxTokens)
		}
		for _, t := range in {
			if t < 0 || t >= e.info.VocabSize {
				return nil, parley.FieldErrorf("input", "token id %d is outside the vocabulary", t)
			}
		}
	}
	job := &embedJob{inputs: inputs, out: make([][]float32, len(inputs)), res: make(chan embedResult, 1)}
	seq := &sequence{ctx: ctx, client: client, embed: job, iBatch: -1, submitted: time.Now()}
	res := job.res // the loop owns job from the push on

	e.closeMu.RLock()
	if e.closed {
		e.closeMu.RUnlock()
		return nil, parley.Errorf(parley.EUnavailable, "the model is shutting down")
	}
	e.queued.Add(1)
	if err := e.queue.push(seq); err != nil {
		e.queued.Add(-1)
		e.busyRefusals.Add(1)
		e.closeMu.RUnlock()
		return nil, err
	}
	e.closeMu.RUnlock()
	// The loop always answers (the outputs, the cancellation, or the
	// shutdown) into res's buffer, so leaving on ctx leaks nothing: the
	// loop drops a cancelled call when it reaches it.
	select {
	case r := <-res:
		return r.out, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
