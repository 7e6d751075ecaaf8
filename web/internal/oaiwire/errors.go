// Package oaiwire is OpenAI's error object, which two families answer with:
// OpenAI's chat and completions APIs and its Responses API.
package oaiwire

import (
	"fmt"
	"net/http"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Error is OpenAI's error object, {"message", "type", "param",
// "code"}: param is the request field the client sent (null when the error
// is not about one), code Parley's error code.
type Error struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// ErrorBody is what an OpenAI route answers with an error status.
type ErrorBody struct {
	Error Error `json:"error"`
}

// errorTypes is OpenAI's error "type" of each code (its client
// libraries pick their exception class by the status).
var errorTypes = map[string]string{
	parley.EInvalid:      "invalid_request_error",
	parley.ETooLarge:     "invalid_request_error",
	parley.EBusy:         "server_error",
	parley.ERateLimited:  "rate_limit_error",
	parley.ENotFound:     "invalid_request_error",
	parley.EUnauthorized: "authentication_error",
	parley.EForbidden:    "permission_error",
	parley.EUnavailable:  "server_error",
	parley.EInternal:     "server_error",
	parley.EStoreFull:    "server_error",
}

// NewError is err in OpenAI's shape. A prompt over a limit is
// OpenAI's context_length_exceeded, worded as OpenAI words it (clients
// such as Codex match the code and trim their history), Parley's message
// after it.
func NewError(err error) Error {
	code := parley.ErrorCode(err)
	e := Error{Message: parley.ErrorMessage(err), Type: errorTypes[code], Code: &code}
	if e.Type == "" {
		e.Type = "server_error"
	}
	if f := apicore.ErrorField(err); f != "" {
		e.Param = &f
	}
	if tokens, limit, ok := parley.PromptLimit(err); ok {
		c, param := contextLengthExceeded, "messages"
		e.Code, e.Param = &c, &param
		e.Message = fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. "+
			"Please reduce the length of the messages. (%s)", limit, tokens, e.Message)
	}
	return e
}

// contextLengthExceeded is OpenAI's error code for a prompt over the
// context window.
const contextLengthExceeded = "context_length_exceeded"

// ErrorBodyOf is err as OpenAI's error body.
func ErrorBodyOf(err error) any { return ErrorBody{Error: NewError(err)} }

// Status is err's HTTP status on OpenAI's routes: the core's, except
// that a prompt over a limit is a 400, as OpenAI answers it (a 413 there
// reads as a body over the size limit: Codex retries).
func Status(err error) int {
	if _, _, ok := parley.PromptLimit(err); ok {
		return http.StatusBadRequest
	}
	return apicore.ErrorStatus(err)
}
