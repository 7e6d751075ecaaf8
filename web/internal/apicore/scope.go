package apicore

import (
	"context"

	"github.com/parley-chat/parley"
)

// scopeKey is the context key of WithCacheScope.
type scopeKey struct{}

// WithCacheScope returns a context whose request uses the cache scope
// scope (parley.UserCacheScope's, parley.ClientCacheScope's or a narrowing
// of them). The edge keeps the scope here from its middleware to the
// handler, which takes it once (FactsOf) and passes it on as an argument
// (Facts.Scope) or a field (parley.ReplyRequest.Scope).
func WithCacheScope(ctx context.Context, scope string) context.Context {
	return context.WithValue(ctx, scopeKey{}, scope)
}

// CacheScope returns the scope WithCacheScope put in ctx, else its user's
// (CallerOf), so that a context that names no scope never shares
// another user's caches.
func CacheScope(ctx context.Context) string {
	if s, ok := ctx.Value(scopeKey{}).(string); ok {
		return s
	}
	return parley.UserCacheScope(CallerOf(ctx).User)
}
