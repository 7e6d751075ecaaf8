// Package session owns conversations: one Session is a conversation's id,
// system prompt, history, per-session settings and lifetime, and a Store
// keeps sessions (in memory, durably in a bbolt file, or in Redis shared by
// several replicas). Service runs the turns of a conversation on top of a
// Store and a Responder, so the wire layer holds no conversation logic: it
// loads the history, asks for a reply, and commits the finished turn before
// the reply's final event is forwarded.
//
// The package knows nothing about the wire format and nothing about the
// engine; it speaks the root package's Message, Params and Event types and
// reaches the chat layer only through the root package's Responder.
package session

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/parley-chat/parley"
)

// idBytes is the entropy of a session id: 128 bits, so ids can be neither
// guessed nor enumerated, and a leaked id is the only way into a session.
const idBytes = 16

// idEncoding renders ids as 22 URL-safe characters without padding. Strict
// decoding rejects the 4 unused trailing bits, so every id has exactly one
// spelling and ValidID accepts only what NewID can produce. (A function, not
// a package variable: the package keeps no mutable globals.)
func idEncoding() *base64.Encoding { return base64.RawURLEncoding.Strict() }

// Session is one conversation. Values handed out by a Store or a Service are
// copies: changing them changes nothing stored until they are Put.
type Session struct {
	ID       string           `json:"id"`
	System   string           `json:"system"`           // system prompt; "" = none
	Messages []parley.Message `json:"messages"`         // user and assistant turns, oldest first; no system messages
	Params   *parley.Params   `json:"params,omitempty"` // per-session overrides of the server's defaults; nil = defaults
	Created  time.Time        `json:"created"`
	Updated  time.Time        `json:"updated"` // last Put; a session idle for longer than the store's TTL expires

	// The Responses and Conversations APIs' state (responses.go); all
	// omitted when unused, so sessions stored before them read unchanged.
	Trimmed   int               `json:"trimmed,omitempty"`   // messages the byte cap has dropped from the front, ever: Messages[0]'s absolute position
	Responses []ResponseRecord  `json:"responses,omitempty"` // the turns run through the Responses API, oldest first
	Metadata  map[string]string `json:"metadata,omitempty"`  // a conversation's metadata

	// Owner is the key of the client that created the session
	// (parley.Caller.Client; never a secret), fixed at creation: the store counts a
	// client's sessions by it. "" for sessions created without a client,
	// and for those stored before owners were recorded.
	Owner string `json:"owner,omitempty"`
	// User is the user the session belongs to (parley.Caller.User: the name
	// an API key maps to; "" is the anonymous user), fixed at creation.
	// Only that user reaches the session: anyone else's request for it is
	// answered as for an unknown id (Service.get).
	User string `json:"user,omitempty"`

	// Model is the model the conversation is held with when the server
	// serves several (named when it is created), fixed at creation: its
	// turns run on it. "" for a server with one model, and for sessions
	// stored before several models were served: their turns run on the
	// request's model.
	Model string `json:"model,omitempty"`
}

// NewID returns a fresh random session id (22 URL-safe characters).
func NewID() (string, error) {
	var b [idBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("session id: %w", err)
	}
	return idEncoding().EncodeToString(b[:]), nil
}

// ValidID reports whether s has the form of an id NewID returns. It checks
// input from clients before any store lookup.
func ValidID(s string) bool {
	if len(s) != idEncoding().EncodedLen(idBytes) {
		return false
	}
	b, err := idEncoding().DecodeString(s)
	return err == nil && len(b) == idBytes
}

// Clone returns a deep copy of s: no slice or pointer is shared with s.
func (s *Session) Clone() *Session {
	if s == nil {
		return nil
	}
	c := *s
	c.Messages = slices.Clone(s.Messages)
	c.Responses = slices.Clone(s.Responses)
	c.Metadata = maps.Clone(s.Metadata)
	if s.Params != nil {
		p := *s.Params
		p.Stop = slices.Clone(s.Params.Stop)
		p.JSONSchema = slices.Clone(s.Params.JSONSchema)
		c.Params = &p
	}
	return &c
}

// Bytes is the size of the conversation's text as the per-session cap
// counts it: the system prompt plus every message's role and content, in
// bytes. Images are not counted here: a conversation's images are held to a
// budget of their own (WithMaxConversationImageBytes), and the store's byte
// budget counts them with everything else.
func (s *Session) Bytes() int {
	n := len(s.System)
	for _, m := range s.Messages {
		n += messageBytes(m)
	}
	return n
}

// messageBytes is the bytes of m's text as the per-session cap counts them.
func messageBytes(m parley.Message) int { return len(m.Role) + len(m.Content) }

// keptFrom is the index of s.Messages from which the cap of text drops
// nothing (trimHistory): len(s.Messages), or the first input message of the
// newest response when it reaches the end of the history, so a Responses
// request whose input items come before its prompt keeps its record whole.
func (s *Session) keptFrom() int {
	keep := len(s.Messages)
	if n := len(s.Responses); n > 0 {
		if r := s.Responses[n-1]; r.End >= s.Next() {
			keep = min(max(r.Start-s.Trimmed, 0), keep)
		}
	}
	return keep
}

// trimHistory drops the oldest turns of msgs until the system prompt
// (systemBytes) and the rest fit in maxBytes, but never the newest turn, nor
// any message from index keep on (Session.keptFrom). A turn is a user
// message and everything up to the next user message, so a user prompt
// never loses its reply while staying itself. It returns the kept suffix
// (sharing msgs' backing array) and how many messages were dropped. A newest
// turn larger than maxBytes alone is kept whole, the turns before it
// dropped: a conversation is never emptied by the cap, and what one turn
// adds is bounded by the request's own limits (a request body, a socket
// message, the reply's max tokens). maxBytes <= 0 means no cap.
func trimHistory(msgs []parley.Message, systemBytes, maxBytes, keep int) ([]parley.Message, int) {
	if maxBytes <= 0 {
		return msgs, 0
	}
	total := systemBytes
	newest := 0 // where the newest turn starts
	for i, m := range msgs {
		total += messageBytes(m)
		if m.Role == parley.RoleUser {
			newest = i
		}
	}
	newest = min(newest, keep)
	start := 0
	for total > maxBytes && start < newest {
		// Drop msgs[start] and everything after it up to the next user message.
		total -= messageBytes(msgs[start])
		start++
		for start < newest && msgs[start].Role != parley.RoleUser {
			total -= messageBytes(msgs[start])
			start++
		}
	}
	return msgs[start:], start
}
