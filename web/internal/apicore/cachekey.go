package apicore

import (
	"context"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
)

// maxCacheKeyBytes bounds a prompt_cache_key or cache_salt.
const maxCacheKeyBytes = 1024

// CacheKeyFields are the fields with which an OpenAI-style request narrows
// its cache scope (NarrowCacheScope): OpenAI's prompt_cache_key and
// vLLM's cache_salt. Requests of one user that give the same value share
// cached prefixes; with another value (or none) they share nothing. They
// never reach another user's caches: the narrowing is within the user's own
// scope.
type CacheKeyFields struct {
	PromptCacheKey string `json:"prompt_cache_key"`
	CacheSalt      string `json:"cache_salt"`
}

// Narrow returns ctx with its scope narrowed by the request's fields (and
// the prompt_cache_key kept for SentAffinityKey).
func (f *CacheKeyFields) Narrow(ctx context.Context) (context.Context, error) {
	for _, v := range []struct{ field, value string }{{"prompt_cache_key", f.PromptCacheKey}, {"cache_salt", f.CacheSalt}} {
		if len(v.value) > maxCacheKeyBytes {
			return nil, parley.FieldErrorf(v.field, "must be at most %d bytes, got %d", maxCacheKeyBytes, len(v.value))
		}
		if v.value != "" {
			ctx = NarrowCacheScope(ctx, v.field+"="+v.value)
		}
	}
	return withPromptCacheKey(ctx, f.PromptCacheKey), nil
}

// NarrowRequest narrows the scope of c's request by f.
func NarrowRequest(c echo.Context, f *CacheKeyFields) error {
	r := c.Request()
	ctx, err := f.Narrow(r.Context())
	if err != nil {
		return err
	}
	c.SetRequest(r.WithContext(ctx))
	return nil
}
