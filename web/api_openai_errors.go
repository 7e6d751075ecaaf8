package web

import (
	"fmt"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// openAIError is OpenAI's error object, {"message", "type", "param",
// "code"}: param is the request field the client sent (null when the error
// is not about one), code Parley's error code.
type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// openAIErrorBody is what an OpenAI route answers with an error status.
type openAIErrorBody struct {
	Error openAIError `json:"error"`
}

// openAIErrorTypes is OpenAI's error "type" of each code (its client
// libraries pick their exception class by the status).
var openAIErrorTypes = map[string]string{
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

// newOpenAIError is err in OpenAI's shape. A prompt over a limit is
// OpenAI's context_length_exceeded, worded as OpenAI words it (clients
// such as Codex match the code and trim their history), Parley's message
// after it.
func newOpenAIError(err error) openAIError {
	code := parley.ErrorCode(err)
	e := openAIError{Message: parley.ErrorMessage(err), Type: openAIErrorTypes[code], Code: &code}
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

// responseErrorCode is the code of a failed Responses object's error
// (OpenAI's ResponseError.code names a few kinds, not HTTP-level ones).
func responseErrorCode(err error) string {
	switch parley.ErrorCode(err) {
	case parley.EInvalid, parley.ETooLarge:
		return "invalid_prompt"
	case parley.ERateLimited:
		return "rate_limit_exceeded"
	}
	return "server_error"
}
