package router

import (
	"context"
	"time"

	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/web"
	"github.com/parley-chat/parley/web/embed"
)

// Embedding models and rerankers are models like any other here: an entry
// whose GGUF names a pooling type loads as an engine of its own (llm.Open
// makes it an embedding engine), with its own residency and keep-alive, and
// the embedding endpoints hold it through the registry as a chat reply
// holds its model.

var (
	_ web.EmbedModels = (*Router)(nil)
	_ web.EmbedModels = (*EngineRef)(nil)
)

// embedTarget is e as package embed's handlers see it (name as replies
// show it; release, when set, is called once the request is done).
func embedTarget(name string, e *llm.Engine, release func()) embed.Target {
	i := e.EmbedInfo()
	return embed.Target{Name: name, Model: e, Release: release,
		Info: embed.Info{Pooling: i.Pooling, Dimensions: i.Dimensions, MaxTokens: i.MaxTokens}}
}

// EmbedModel holds the named model for one embedding or rerank request
// (web.EmbedModels), loading it when it is not loaded. A model whose GGUF
// header names no pooling type (a chat model) is answered with no pooling,
// which the handlers refuse, without loading it.
func (m *Router) EmbedModel(ctx context.Context, name string, keepAlive *time.Duration) (embed.Target, error) {
	n, err := m.reg.Resolve(name)
	if err != nil {
		return embed.Target{}, err
	}
	s := m.served[n]
	if h := s.ref.Info(); h.Architecture != "" && h.Pooling == "" {
		return embed.Target{Name: n}, nil
	}
	if err := s.check(); err != nil {
		return embed.Target{}, err
	}
	l, err := m.reg.Acquire(ctx, n, keepAlive, nil)
	if err != nil {
		return embed.Target{}, err
	}
	return embedTarget(n, l.Model().(*resident).eng, l.Release), nil
}

// EmbedModel is the one model, whatever name says (web.EmbedModels): its
// name in replies is the request's model field, or the model's own when
// the request names none.
func (r *EngineRef) EmbedModel(ctx context.Context, name string, _ *time.Duration) (embed.Target, error) {
	e := r.p.Load()
	if e == nil {
		return embed.Target{}, errLoading
	}
	if name == "" {
		name = e.Info().Name
	}
	return embedTarget(name, e, nil), nil
}
