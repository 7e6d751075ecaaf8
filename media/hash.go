package media

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// CacheKey is the key under which the engine may keep what an image encoded to (its KV, its embeddings): the
// image's content hash joined to the user's name, so that one user's cached image is never reused for another,
// even for the same bytes (a cache hit is observable in timing). The user's name is length-prefixed, so no two
// (user, hash) pairs share a key.
func CacheKey(user string, hash [32]byte) [32]byte {
	h := sha256.New()
	h.Write([]byte("parley image cache key\x00"))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(user)))
	h.Write(n[:])
	h.Write([]byte(user))
	h.Write(hash[:])
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// HashString is hash in lower-case hex, as stores and logs name an image.
func HashString(hash [32]byte) string { return hex.EncodeToString(hash[:]) }
