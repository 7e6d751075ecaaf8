package parley

import (
	"crypto/sha256"
	"encoding/hex"
)

// A conversation's affinity key is what a load balancer in front of several
// replicas routes it on, so that its turns reach the replica whose slot (or
// RAM) holds its KV cache; a turn that reaches another replica restores the
// conversation's state from the shared KV tier instead. The balancer hashes
// on the AffinityHeader (deploy/nginx.conf does, consistently: a replica
// that goes away moves only its own conversations), and every reply carries
// the key back in that header, so a client that echoes it stays put.

// AffinityHeader is the HTTP header of a conversation's affinity key.
const AffinityHeader = "X-Parley-Session"

// maxAffinityKeyBytes bounds a key returned as the client sent it; a longer
// one, or one with a byte outside affinityChar, is returned hashed.
const maxAffinityKeyBytes = 128

// AffinityKey returns the affinity key of a request of user: sent, the key
// the client gave (the AffinityHeader, OpenAI's prompt_cache_key, a session
// id, a Responses conversation; the first of them the request has), as it
// is when it is short and made of URL-safe bytes, else a hash of it; with
// none, DeriveAffinityKey of user and msgs. Every replica computes the same
// key for the same request, and the key it returns, sent again, comes back
// unchanged.
func AffinityKey(user, sent string, msgs []Message) string {
	if sent == "" {
		return DeriveAffinityKey(user, msgs)
	}
	if len(sent) <= maxAffinityKeyBytes && affinitySafe(sent) {
		return sent
	}
	return "k-" + affinityHash("sent", sent)
}

// DeriveAffinityKey is the affinity key of a stateless client's
// conversation (one that resends it whole and names no key): a hash of its
// user and its opening, every message up to and including the first user
// message, which stays the same from turn to turn as the conversation
// grows. Two conversations of one user with the same opening share a key
// (and a replica; the engine's prefix check keeps each one's cache correct);
// no other user's conversation has it. "" when msgs is empty.
func DeriveAffinityKey(user string, msgs []Message) string {
	if len(msgs) == 0 {
		return ""
	}
	parts := []string{"opening", user}
	for _, m := range msgs {
		parts = append(parts, string(m.Role), m.Content)
		if m.Role == RoleUser {
			break
		}
	}
	return "c-" + affinityHash(parts...)
}

// affinityHash is a hash of parts, each length-prefixed so that no two
// lists of parts collide by concatenation.
func affinityHash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		for i, l := 0, uint64(len(p)); i < 8; i, l = i+1, l>>8 {
			n[i] = byte(l)
		}
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// affinitySafe reports whether s is made of bytes a header, a query
// parameter and a log line carry as they are.
func affinitySafe(s string) bool {
	for i := range len(s) {
		if !affinityChar(s[i]) {
			return false
		}
	}
	return true
}

func affinityChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':'
}
