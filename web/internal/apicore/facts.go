package apicore

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
)

// Facts are what a request says about who it comes from and how it is
// served, beyond its messages and sampling: its caller, the cache scope its
// replies use, the model it picks and how long that model stays loaded
// after it. The edge's middleware settles what it knows of them (the
// caller and the cache scope: WithFacts) before the handler runs; the
// handler takes them once, at its top (FactsOf), fills in what its body
// says (the model, the keep-alive, the cache key) and passes them, as an
// argument, to every helper that needs one. No helper reads them from a
// context, and no layer below the web sees them but as arguments and
// fields (session.Service's methods, parley.ReplyRequest's User, Client,
// Scope, Model and KeepAlive).
type Facts struct {
	// Caller is who the request comes from: the user its API key maps to
	// ("" the anonymous user) and its client (UserClient).
	Caller parley.Caller
	// Scope is the cache scope of the request's replies
	// (parley.UserCacheScope's, parley.ClientCacheScope's, or a narrowing
	// of them by its cache key: CacheKeyFields.Narrow).
	Scope string
	// CacheKey is the request's prompt_cache_key ("" without one), which
	// names its affinity key when it sends no header (SentAffinityKey).
	CacheKey string
	// Model is the served name of the request's model (ResolveModel); ""
	// is the default model, and every request's with one model.
	Model string
	// KeepAlive is how long the model stays loaded once idle after the
	// request (Ollama's keep_alive); nil leaves it to the server's policy.
	KeepAlive *time.Duration
}

// factsKey is the context key of WithFacts.
type factsKey struct{}

// WithFacts returns ctx carrying f, the facts the edge's middleware
// settles for a request before its handler runs. Only FactsOf and
// FactsOfRequest read them back.
func WithFacts(ctx context.Context, f Facts) context.Context {
	return context.WithValue(ctx, factsKey{}, f)
}

// FactsOf is what the edge settled of c's request's facts (WithFacts). A
// handler calls it once, at its top, and passes the facts on.
func FactsOf(c echo.Context) Facts { return FactsOfRequest(c.Request()) }

// FactsOfRequest is FactsOf for code that holds only the request (a
// middleware, the embeddings' lookup). A request the edge did not tag is
// the anonymous user's; a request without a scope has its user's, so that
// it never shares another user's caches.
func FactsOfRequest(r *http.Request) Facts {
	f, _ := r.Context().Value(factsKey{}).(Facts)
	if f.Scope == "" {
		f.Scope = parley.UserCacheScope(f.Caller.User)
	}
	return f
}
