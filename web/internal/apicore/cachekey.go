package apicore

import (
	"github.com/parley-chat/parley"
)

// maxCacheKeyBytes bounds a prompt_cache_key or cache_salt.
const maxCacheKeyBytes = 1024

// CacheKeyFields are the fields with which an OpenAI-style request narrows
// its cache scope (Narrow): OpenAI's prompt_cache_key and
// vLLM's cache_salt. Requests of one user that give the same value share
// cached prefixes; with another value (or none) they share nothing. They
// never reach another user's caches: the narrowing is within the user's own
// scope.
type CacheKeyFields struct {
	PromptCacheKey string `json:"prompt_cache_key"`
	CacheSalt      string `json:"cache_salt"`
}

// Narrow narrows facts' scope by the request's fields
// (parley.NarrowCacheScope; an empty field narrows nothing) and keeps its
// prompt_cache_key in facts for SentAffinityKey. facts is unchanged when
// a field is refused.
func (f *CacheKeyFields) Narrow(facts *Facts) error {
	scope := facts.Scope
	for _, v := range []struct{ field, value string }{{"prompt_cache_key", f.PromptCacheKey}, {"cache_salt", f.CacheSalt}} {
		if len(v.value) > maxCacheKeyBytes {
			return parley.FieldErrorf(v.field, "must be at most %d bytes, got %d", maxCacheKeyBytes, len(v.value))
		}
		if v.value != "" {
			scope = parley.NarrowCacheScope(scope, v.field+"="+v.value)
		}
	}
	facts.Scope, facts.CacheKey = scope, f.PromptCacheKey
	return nil
}
