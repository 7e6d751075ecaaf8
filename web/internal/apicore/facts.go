package apicore

import (
	"time"

	"github.com/labstack/echo/v4"
)

// Facts are what a request says about how it is served, beyond its
// messages and sampling: the cache scope its replies use, the model it
// picks and how long that model stays loaded after it. The edge's
// middleware settles what it knows of them (the cache scope) before the
// handler runs; the handler takes them once, at its top (FactsOf), fills
// in what its body says (the model, the keep-alive, the cache key) and
// passes them, as an argument, to every helper that needs one. No helper
// reads them from a context.
type Facts struct {
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

// FactsOf is what the edge settled of c's request's facts: its cache
// scope. A handler calls it once, at its top, and passes the facts on.
func FactsOf(c echo.Context) Facts {
	return Facts{Scope: CacheScope(c.Request().Context())}
}
