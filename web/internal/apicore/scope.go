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
// handler, which passes it on as a field (parley.ReplyRequest.Scope); no
// layer below the web reads it from a context.
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

// NarrowCacheScope returns ctx with its scope narrowed by key
// (parley.NarrowCacheScope); an empty key changes nothing.
func NarrowCacheScope(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return WithCacheScope(ctx, parley.NarrowCacheScope(CacheScope(ctx), key))
}
