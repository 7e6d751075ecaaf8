package apicore

import (
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
)

// A reply names its conversation's affinity key in parley.AffinityHeader,
// so that a balancer hashing on the header keeps the conversation on the
// replica that holds its cache once the client sends the key back. The key
// is the client's own when it sent one (the header, else its
// prompt_cache_key); else each family derives one that stays the same turn
// after turn: a chat's from its user and opening (parley.AffinityKey), a
// raw prompt's from its user and first bytes (CompletionAffinity).

// SentAffinityKey returns the affinity key c's client sent: the
// AffinityHeader, else the request's prompt_cache_key (f.CacheKey); ""
// without either.
func SentAffinityKey(c echo.Context, f Facts) string {
	if k := c.Request().Header.Get(parley.AffinityHeader); k != "" {
		return k
	}
	return f.CacheKey
}

// SetAffinity names key in the reply's AffinityHeader; "" sets none.
func SetAffinity(c echo.Context, key string) {
	if key != "" {
		c.Response().Header().Set(parley.AffinityHeader, key)
	}
}

// completionOpeningBytes is how much of a raw prompt its derived affinity
// key hashes: a completion has no messages, so its opening is its first
// bytes. A prompt that grows by appending keeps its key once it is past
// them (a shorter one gets a new key when it grows).
const completionOpeningBytes = 256

// CompletionAffinity is the affinity key of a raw-prompt request of user:
// the key sent (parley.AffinityKey), else one derived from the prompt's
// first completionOpeningBytes (cut at a character's start).
func CompletionAffinity(user, sent, prompt string) string {
	if sent == "" && prompt == "" {
		return ""
	}
	opening := prompt
	if len(opening) > completionOpeningBytes {
		n := completionOpeningBytes
		for n > 0 && !utf8.RuneStart(opening[n]) {
			n--
		}
		opening = opening[:n]
	}
	return parley.AffinityKey(user, sent, []parley.Message{{Role: parley.RoleUser, Content: opening}})
}
