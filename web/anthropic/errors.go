package anthropic

import (
	"fmt"
	"net/http"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// anthropicError is Anthropic's error object; anthropicErrorBody is what
// the Messages routes answer with an error status (and, as an "error"
// event, end a stream with).
type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

type anthropicErrorBody struct {
	Type  string         `json:"type"` // "error"
	Error anthropicError `json:"error"`
}

// anthropicErrorTypes is Anthropic's error "type" of each code.
var anthropicErrorTypes = map[string]string{
	parley.EInvalid:      "invalid_request_error",
	parley.ETooLarge:     "request_too_large",
	parley.EBusy:         "overloaded_error",
	parley.ERateLimited:  "rate_limit_error",
	parley.ENotFound:     "not_found_error",
	parley.EUnauthorized: "authentication_error",
	parley.EForbidden:    "permission_error",
	parley.EUnavailable:  "overloaded_error",
	parley.EInternal:     "api_error",
	parley.EStoreFull:    "api_error",
}

// newAnthropicError is err in Anthropic's shape. A prompt over a limit is
// an invalid_request_error worded as Anthropic words it ("prompt is too
// long: N tokens > M maximum", which Claude Code matches to compact its
// conversation), Parley's message after it.
func newAnthropicError(err error) anthropicError {
	if tokens, limit, ok := parley.PromptLimit(err); ok {
		return anthropicError{Type: "invalid_request_error",
			Message: fmt.Sprintf("prompt is too long: %d tokens > %d maximum (%s)", tokens, limit, parley.ErrorMessage(err))}
	}
	t := anthropicErrorTypes[parley.ErrorCode(err)]
	if t == "" {
		t = "api_error"
	}
	return anthropicError{Type: t, Message: parley.ErrorMessage(err)}
}

// ErrorBody is err as Anthropic's error body.
func ErrorBody(err error) any {
	return anthropicErrorBody{Type: "error", Error: newAnthropicError(err)}
}

// Status is err's HTTP status on Anthropic's routes: the core's, except
// that a prompt over a limit is a 400, as Anthropic answers it (a 413 there
// reads as a body over the size limit: Claude Code asks to remove images).
func Status(err error) int {
	if _, _, ok := parley.PromptLimit(err); ok {
		return http.StatusBadRequest
	}
	return apicore.ErrorStatus(err)
}
