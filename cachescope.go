package parley

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// A cache scope is the part of the engine's caches a request may use: the
// KV cache a slot holds (reused by the next request of the same scope), the
// prefix another slot shares (copied), the KV swap's saved states (by key,
// in RAM and on disk) and the chat layer's memo of a conversation's tokens.
// A request is never served from, nor told about (cached-token counts,
// timing), tokens cached for another scope. Every user has a scope of its
// own (and, where the server says so, every client of a user:
// ClientCacheScope); a request may narrow its scope (OpenAI's
// prompt_cache_key, vLLM's cache_salt: NarrowCacheScope), never widen it.
// A request carries its scope in a field (ReplyRequest.Scope,
// GenerateRequest.Scope).
//
// A scope is an opaque string, a hash of what it was derived from, so a key
// prefixed with it (ScopedKey) carries no user name and no client text and
// cannot be forged from inside another scope. A scope within a user's (a
// client's, a narrowing) starts with the user's scope and a dot, so the
// user a key belongs to is read off the key (ScopeOwner): the shared KV
// tier keeps each user's states within a fair share by it.

// scopeLen is the length of a scope in hex digits (96 bits).
const scopeLen = 24

// deriveScope is the scope of kind=value within parent.
func deriveScope(parent, kind, value string) string {
	h := sha256.New()
	for _, s := range []string{parent, kind, value} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:scopeLen]
}

// UserCacheScope is the scope of user's requests when the server does not
// split users by client. The anonymous user's ("") is "": its keys are the
// keys as given, unscoped, so the states a server without
// named users saved stay valid. No other scope is "" (each is a hash), and
// no key the server makes looks like one within another scope.
func UserCacheScope(user string) string {
	if user == "" {
		return ""
	}
	return deriveScope("", "user", user)
}

// ClientCacheScope is the scope of user's requests from client, where the
// server gives every client of a user a scope of its own.
func ClientCacheScope(user, client string) string {
	return within(UserCacheScope(user), "client", client)
}

// within is the scope of kind=value within parent: the user's part of
// parent, a dot, and a hash of parent, kind and value.
func within(parent, kind, value string) string {
	owner, _, _ := strings.Cut(parent, ".")
	return owner + "." + deriveScope(parent, kind, value)
}

// ScopeOwner returns the user a key (ScopedKey's) belongs to, as the user's
// scope (UserCacheScope): the same for every client's and narrowing's key
// of the user, "" for the anonymous user's (whose keys are unscoped). It
// reveals nothing the key does not: the scope is a hash.
func ScopeOwner(key string) string {
	scope, _, ok := strings.Cut(key, ":")
	if !ok {
		return ""
	}
	owner, _, _ := strings.Cut(scope, ".")
	if len(owner) != scopeLen || strings.Trim(owner, "0123456789abcdef") != "" {
		return "" // an unscoped key of the anonymous user's with a colon of its own
	}
	return owner
}

// NarrowCacheScope returns scope split by key (a client's prompt_cache_key
// or cache_salt): requests that give the same key share caches, others of
// the same user no longer do with them. An empty key changes nothing.
func NarrowCacheScope(scope, key string) string {
	if key == "" {
		return scope
	}
	return within(scope, "key", key)
}

// ScopedKey returns key (a session id, a stateless conversation's key)
// within scope: the key the engine's caches keep its state under. It is
// idempotent: a key already within scope is returned as it is. "" (no key)
// stays "".
func ScopedKey(scope, key string) string {
	if key == "" || scope == "" || strings.HasPrefix(key, scope+":") {
		return key
	}
	return scope + ":" + key
}
