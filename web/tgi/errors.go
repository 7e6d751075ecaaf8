package tgi

import "github.com/parley-chat/parley"

// tgiError is TGI's error (router/src/lib.rs ErrorResponse), before a
// stream and as a stream's last event.
type tgiError struct {
	Error     string `json:"error"`
	ErrorType string `json:"error_type"`
}

// tgiErrorTypes is TGI's ErrorResponse.error_type of each code.
var tgiErrorTypes = map[string]string{
	parley.EInvalid:      "validation",
	parley.ETooLarge:     "validation",
	parley.EBusy:         "overloaded",
	parley.ERateLimited:  "overloaded",
	parley.ENotFound:     "validation",
	parley.EUnauthorized: "validation",
	parley.EForbidden:    "validation",
	parley.EUnavailable:  "overloaded",
	parley.EInternal:     "generation",
	parley.EStoreFull:    "overloaded",
}

func newTGIError(err error) tgiError {
	t := tgiErrorTypes[parley.ErrorCode(err)]
	if t == "" {
		t = "generation"
	}
	return tgiError{Error: parley.ErrorMessage(err), ErrorType: t}
}

// ErrorBody is err as TGI's error body, for the routes that speak TGI
// (/generate without a format, /generate_stream, /invocations).
func ErrorBody(err error) any { return newTGIError(err) }
