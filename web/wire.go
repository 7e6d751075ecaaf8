package web

// Wire helpers that every API's request parsing shares: whether a raw field
// was sent, OpenAI-style roles and content, and renaming the field an error
// names from the shared validation's name to the wire's.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/parley-chat/parley"
)

// parseRole maps an OpenAI message role to Parley's ("developer" is the
// newer name for "system").
func parseRole(role, field string) (parley.Role, error) {
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

// parseContent takes a message's content: a string, or an array of text
// parts whose types are among partTypes ("text" when none are given).
func parseContent(raw json.RawMessage, field string, partTypes ...string) (string, error) {
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

// isSet reports whether a raw JSON field was sent with a value other than null.
func isSet(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// renameField renames the field an error names from one wire's name to another's.
func renameField(err error, from, to string) error {
	var pe *parley.Error
	if !errors.As(err, &pe) || pe.Field != from {
		return err
	}
	return &parley.Error{Code: pe.Code, Field: to, Message: to + strings.TrimPrefix(pe.Message, from)}
}

// prefixField puts prefix before the field an EInvalid error names, so a
// TGI client reads parameters.temperature where the shared validation says
// temperature.
func prefixField(err error, prefix string) error {
	var pe *parley.Error
	if !errors.As(err, &pe) || pe.Field == "" || pe.Field == "prompt" || strings.HasPrefix(pe.Field, prefix) {
		return err
	}
	return &parley.Error{Code: pe.Code, Field: prefix + pe.Field, Message: prefix + pe.Message}
}
