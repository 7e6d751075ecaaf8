package session

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Response ids name one response and must not hand out its conversation:
// whoever is shown a response id (in a bug report, a log, a shared link)
// may read that response and chain from it, but not learn the session id,
// which grants the whole conversation (reading every turn, adding to it,
// deleting it, opening it in the chat page).
//
// A response id is "resp_" + base64url(nonce || E(sid XOR (nonce||nonce))):
// an 8-byte random nonce, and the session id's 16 bytes masked with it and
// encrypted with one AES-128 block under a key the store keeps (IDKeyStore),
// so every replica and every restart reads the same ids. Without the key
// the id says nothing about the session, and two ids of one session look
// unrelated. The id is only a pointer: a response is found by looking up
// the session and then the exact id among its records, so a forged or
// altered id finds nothing.
//
// Ids of the earlier form, "resp_" + the session id + 12 hex digits, are
// still accepted: they were handed out with their session id in them
// already, so accepting them reveals nothing new.

// IDKeyStore is a Store that keeps the key response ids are encrypted
// with, created on first use. A store without it gets a random key per
// Service: its response ids stop resolving when the process restarts.
type IDKeyStore interface {
	IDKey(ctx context.Context) ([]byte, error)
}

// idKeyBytes is the AES-128 key size of response ids.
const idKeyBytes = 16

const (
	responseNonceBytes = 8
	// newResponseIDLen is the length of a response id after its prefix.
	newResponseIDLen = (responseNonceBytes + idBytes) * 4 / 3
)

// idCipher encrypts session ids into response ids; it loads the store's
// key on first use. Safe for concurrent use.
type idCipher struct {
	store Store

	mu    sync.Mutex
	block cipher.Block // guarded by mu; nil until loaded
}

func (c *idCipher) load(ctx context.Context) (cipher.Block, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.block != nil {
		return c.block, nil
	}
	var key []byte
	if ks, ok := c.store.(IDKeyStore); ok {
		k, err := ks.IDKey(ctx)
		if err != nil {
			return nil, fmt.Errorf("response id key: %w", err)
		}
		key = k
	} else {
		key = make([]byte, idKeyBytes)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("response id key: %w", err)
		}
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("response id key: %w", err)
	}
	c.block = b
	return b, nil
}

// newResponseID returns a fresh response id of session sid.
func (c *idCipher) newResponseID(ctx context.Context, sid string) (string, error) {
	blk, err := c.load(ctx)
	if err != nil {
		return "", err
	}
	raw, err := idEncoding().DecodeString(sid)
	if err != nil || len(raw) != idBytes {
		return "", fmt.Errorf("response id: invalid session id")
	}
	var buf [responseNonceBytes + idBytes]byte
	nonce, sealed := buf[:responseNonceBytes], buf[responseNonceBytes:]
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("response id: %w", err)
	}
	for i := range idBytes {
		sealed[i] = raw[i] ^ nonce[i%responseNonceBytes]
	}
	blk.Encrypt(sealed, sealed)
	return ResponsePrefix + idEncoding().EncodeToString(buf[:]), nil
}

// responseSession returns the session id response id points at, or false
// when id is not a response id (of either form).
func (c *idCipher) responseSession(ctx context.Context, id string) (string, bool, error) {
	rest, ok := strings.CutPrefix(id, ResponsePrefix)
	if !ok {
		return "", false, nil
	}
	if sid, ok := legacyResponseSession(rest); ok {
		return sid, true, nil
	}
	if len(rest) != newResponseIDLen {
		return "", false, nil
	}
	buf, err := idEncoding().DecodeString(rest)
	if err != nil || len(buf) != responseNonceBytes+idBytes {
		return "", false, nil
	}
	blk, err := c.load(ctx)
	if err != nil {
		return "", false, err
	}
	nonce, sealed := buf[:responseNonceBytes], buf[responseNonceBytes:]
	blk.Decrypt(sealed, sealed)
	for i := range idBytes {
		sealed[i] ^= nonce[i%responseNonceBytes]
	}
	return idEncoding().EncodeToString(sealed), true, nil
}

// legacyResponseSession reads a response id of the earlier form (after
// its prefix): the session id, then 2*responseSuffixBytes hex digits.
func legacyResponseSession(rest string) (string, bool) {
	n := idEncoding().EncodedLen(idBytes)
	if len(rest) != n+2*responseSuffixBytes || !ValidID(rest[:n]) {
		return "", false
	}
	if _, err := hex.DecodeString(rest[n:]); err != nil {
		return "", false
	}
	return rest[:n], true
}

// Item ids name a conversation's items: "msg_" + itemKey(sid) + the
// message's absolute position in its session (or "_system" for the system
// prompt). These, ConversationID and newResponseID are the only places ids
// handed to clients are minted.

// ItemPrefix starts every item id.
const ItemPrefix = "msg_"

// itemKey is the part of an item id that names its session: a one-way
// digest of the session id, so an item id (shown with a response) does not
// hand out the conversation either.
func itemKey(sid string) string {
	h := sha256.Sum256([]byte("parley item " + sid))
	return idEncoding().EncodeToString(h[:12])
}

// ItemID names the message at absolute position abs of session sid.
func ItemID(sid string, abs int) string { return ItemPrefix + itemKey(sid) + strconv.Itoa(abs) }

// SystemItemID names a conversation's system prompt, shown as its first item.
func SystemItemID(sid string) string { return ItemPrefix + itemKey(sid) + "_system" }

// CanonicalItemID returns id in the current form: an id of the earlier
// form, "msg_" + sid + position, becomes the ItemID it stands for; any
// other id is returned as it is.
func CanonicalItemID(sid, id string) string {
	if rest, ok := strings.CutPrefix(id, ItemPrefix+sid); ok {
		return ItemPrefix + itemKey(sid) + rest
	}
	return id
}

// ItemPosition returns the absolute position an item id of session sid
// names; ids of the earlier form, "msg_" + sid + position, still work.
func ItemPosition(sid, id string) (int, bool) {
	rest, ok := strings.CutPrefix(id, ItemPrefix+itemKey(sid))
	if !ok {
		if rest, ok = strings.CutPrefix(id, ItemPrefix+sid); !ok {
			return 0, false
		}
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == rest
}

// ConversationID is the conversation id of session sid.
func ConversationID(sid string) string { return ConversationPrefix + sid }
