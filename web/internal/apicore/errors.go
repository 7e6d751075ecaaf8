package apicore

import (
	"errors"
	"net/http"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
)

// statusTable is the one table from error codes to the HTTP status and the
// WebSocket close code. Each API family maps the codes to its own error
// body; the statuses are the same on every wire (but see a family's own
// Status for the exceptions its clients expect).
var statusTable = map[string]struct {
	status    int // HTTP status
	closeCode int // WebSocket close code when the error ends a connection
}{
	parley.EInvalid:      {http.StatusBadRequest, websocket.ClosePolicyViolation},
	parley.ETooLarge:     {http.StatusRequestEntityTooLarge, websocket.CloseMessageTooBig},
	parley.EBusy:         {http.StatusServiceUnavailable, websocket.CloseTryAgainLater},
	parley.ERateLimited:  {http.StatusTooManyRequests, websocket.ClosePolicyViolation},
	parley.ENotFound:     {http.StatusNotFound, websocket.ClosePolicyViolation},
	parley.EUnauthorized: {http.StatusUnauthorized, websocket.ClosePolicyViolation},
	parley.EForbidden:    {http.StatusForbidden, websocket.ClosePolicyViolation},
	parley.EUnavailable:  {http.StatusServiceUnavailable, websocket.CloseGoingAway},
	parley.EInternal:     {http.StatusInternalServerError, websocket.CloseInternalServerErr},
	// A full session store is not the client's fault (4xx) nor a fault of
	// the server (500): 507 says the server cannot store what the request
	// needs, which is exactly the case, and a client backs off on it.
	parley.EStoreFull: {http.StatusInsufficientStorage, websocket.CloseTryAgainLater},
}

// ErrorStatus returns the HTTP status for err's code.
func ErrorStatus(err error) int {
	if m, ok := statusTable[parley.ErrorCode(err)]; ok {
		return m.status
	}
	return http.StatusInternalServerError
}

// CloseCode returns the WebSocket close code for err's code.
func CloseCode(err error) int {
	if m, ok := statusTable[parley.ErrorCode(err)]; ok {
		return m.closeCode
	}
	return websocket.CloseInternalServerErr
}

// StatusCode maps an HTTP status back to an error code, for errors that
// arrive as statuses (the WebSocket upgrader's, echo's).
func StatusCode(status int) string {
	for code, m := range statusTable {
		if m.status == status && code != parley.EUnavailable {
			return code
		}
	}
	return parley.EInternal
}

// RetryAfterSeconds is err's RetryAfter in whole seconds, rounded up (0:
// none).
func RetryAfterSeconds(err error) int {
	d := parley.RetryAfter(err)
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// ErrorBody is the JSON error of Parley's own endpoints (the WebSocket
// upgrade, the plain-text and JSON-lines APIs, /info). The API families
// answer in their own conventions' shapes.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	} `json:"error"`
}

// NewErrorBody is err as Parley's error body.
func NewErrorBody(err error) ErrorBody {
	var b ErrorBody
	b.Error.Code, b.Error.Message, b.Error.Field = parley.ErrorCode(err), parley.ErrorMessage(err), ErrorField(err)
	return b
}

// ErrorField is the request field err names, "" when none.
func ErrorField(err error) string {
	var pe *parley.Error
	if errors.As(err, &pe) {
		return pe.Field
	}
	return ""
}

// ErrOr is err, or an internal error when a failed reply carries none.
func ErrOr(err error) error {
	if err == nil {
		return parley.Errorf(parley.EInternal, "the reply failed")
	}
	return err
}
