package parley

import (
	"errors"
	"fmt"
	"time"
)

// Error codes. The web package maps each to an HTTP status, a WebSocket
// close code and a JSON error code in one table; no other layer picks statuses.
const (
	EInvalid      = "invalid"      // the request is malformed or a parameter is out of range
	ETooLarge     = "too_large"    // a message or prompt exceeds a configured limit
	EBusy         = "busy"         // every slot is taken and the wait queue is full
	ERateLimited  = "rate_limited" // the client sent too much too fast
	ENotFound     = "not_found"    // no such session, model or route
	EUnauthorized = "unauthorized" // a required API key is missing or wrong
	EForbidden    = "forbidden"    // the origin or host is not allowed
	EUnavailable  = "unavailable"  // the server is loading, draining or shutting down
	EInternal     = "internal"     // a bug or an engine failure; the message is safe to show
	// EStoreFull: the session store has no room for the write: it holds as
	// many sessions as it may and none is idle long enough to evict, or the
	// write would take it (or the owner's share of it) past its byte
	// budget, or its disk is full. The message says which.
	EStoreFull = "store_full"
)

// Error is an application error whose message is safe to show a client.
// Field names the offending request field when there is one.
type Error struct {
	Code    string
	Field   string
	Message string
	// RetryAfter, when positive, is how long the client should wait before
	// trying again (rate limits, a full store); the wire shows it as
	// Retry-After.
	RetryAfter time.Duration
	// Tokens and Limit, when Limit is positive, say that the error is a
	// prompt over a limit (code ETooLarge): the prompt's tokens and the
	// most the limit allows. The OpenAI and Anthropic wires answer it as
	// their APIs answer a prompt over the context window (a 400 that their
	// clients recognise), not as a body too large.
	Tokens, Limit int
}

// PromptTooLong returns an ETooLarge error for a prompt of tokens tokens
// over a limit of limit (see Error.Limit), with the formatted message.
func PromptTooLong(tokens, limit int, format string, args ...any) *Error {
	return &Error{Code: ETooLarge, Message: fmt.Sprintf(format, args...), Tokens: tokens, Limit: limit}
}

// PromptLimit returns the prompt's tokens and the limit of the *Error in
// err's chain when it is a prompt over a limit (PromptTooLong).
func PromptLimit(err error) (tokens, limit int, ok bool) {
	var e *Error
	if errors.As(err, &e) && e.Code == ETooLarge && e.Limit > 0 {
		return e.Tokens, e.Limit, true
	}
	return 0, 0, false
}

func (e *Error) Error() string {
	return fmt.Sprintf("parley: code=%s message=%s", e.Code, e.Message)
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldErrorf returns an EInvalid error that names the offending field.
func FieldErrorf(field, format string, args ...any) *Error {
	return &Error{Code: EInvalid, Field: field, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the *Error in err's chain, EInternal for any
// other non-nil error, and "" for nil.
func ErrorCode(err error) string {
	var e *Error
	if err == nil {
		return ""
	} else if errors.As(err, &e) {
		return e.Code
	}
	return EInternal
}

// ErrorMessage returns the client-safe message of the *Error in err's chain,
// or a generic one for errors that may carry internal detail.
func ErrorMessage(err error) string {
	var e *Error
	if err == nil {
		return ""
	} else if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// RetryAfter returns the RetryAfter of the *Error in err's chain (0 when
// there is none or it sets none).
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}
