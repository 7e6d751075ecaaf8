package apicore

// Wire helpers that every API's request parsing shares: whether a raw field
// was sent, OpenAI-style roles and content, and renaming the field an error
// names from the shared validation's name to the wire's.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/parley-chat/parley"
)

// ParseRole maps an OpenAI message role to Parley's ("developer" is the
// newer name for "system").
func ParseRole(role, field string) (parley.Role, error) {
	switch role {
	case "system", "developer":
		return parley.RoleSystem, nil
	case "user":
		return parley.RoleUser, nil
	case "assistant":
		return parley.RoleAssistant, nil
	case "":
		return "", parley.FieldErrorf(field, "is required")
	}
	return "", parley.FieldErrorf(field, "must be system, developer, user or assistant, got %q", role)
}

// ParseContent takes a message's content: a string, or an array of text
// parts whose types are among partTypes ("text" when none are given).
func ParseContent(raw json.RawMessage, field string, partTypes ...string) (string, error) {
	if len(partTypes) == 0 {
		partTypes = []string{"text"}
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", parley.FieldErrorf(field, "is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", parley.FieldErrorf(field, "invalid string: %v", err)
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", parley.FieldErrorf(field, "must be a string or an array of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		switch {
		case !slices.Contains(partTypes, p.Type):
			return "", parley.FieldErrorf(fmt.Sprintf("%s[%d]", field, i), "only text parts are supported, got type %q", p.Type)
		case p.Text == nil:
			return "", parley.FieldErrorf(fmt.Sprintf("%s[%d].text", field, i), "is required")
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// IsSet reports whether a raw JSON field was sent with a value other than null.
func IsSet(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// RenameField renames the field an error names from one wire's name to another's.
func RenameField(err error, from, to string) error {
	var pe *parley.Error
	if !errors.As(err, &pe) || pe.Field != from {
		return err
	}
	return &parley.Error{Code: pe.Code, Field: to, Message: to + strings.TrimPrefix(pe.Message, from)}
}

// PrefixField puts prefix before the field an EInvalid error names, so a
// TGI client reads parameters.temperature where the shared validation says
// temperature.
func PrefixField(err error, prefix string) error {
	var pe *parley.Error
	if !errors.As(err, &pe) || pe.Field == "" || pe.Field == "prompt" || strings.HasPrefix(pe.Field, prefix) {
		return err
	}
	return &parley.Error{Code: pe.Code, Field: prefix + pe.Field, Message: prefix + pe.Message}
}

// CheckNotEmpty refuses a message with no text (an empty string, no parts,
// or parts of empty text) from anyone but the assistant, on every API, as
// an empty prompt is refused: a request must not generate from nothing.
// An empty assistant message is history (a reply that ended at once), and
// clients resend it.
func CheckNotEmpty(role parley.Role, content, field string) error {
	if content == "" && role != parley.RoleAssistant {
		return parley.FieldErrorf(field, "must not be empty")
	}
	return nil
}

// ConversationKey is the KV-cache key of a stateless chat: a hash of the
// conversation up to its first user message. A client that resends a
// growing conversation keeps landing on the slot that holds its prefix, so
// only the new turns are evaluated; different conversations get different
// keys (and the engine's longest-common-prefix check keeps any reuse correct
// even when two share an opening).
func ConversationKey(msgs []parley.Message) string {
	h := sha256.New()
	for _, m := range msgs {
		h.Write([]byte(m.Role))
		h.Write([]byte{0})
		h.Write([]byte(m.Content))
		h.Write([]byte{0})
		if m.Role == parley.RoleUser {
			break
		}
	}
	return "openai:" + hex.EncodeToString(h.Sum(nil)[:12])
}
