package web

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// errorMapping is the one table from error codes to what each wire shows.
var errorMapping = map[string]struct {
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
	parley.EStorageFull:  {http.StatusInsufficientStorage, websocket.CloseTryAgainLater},
	parley.EInternal:     {http.StatusInternalServerError, websocket.CloseInternalServerErr},
}

// ErrorStatus returns the HTTP status for err's code.
func ErrorStatus(err error) int {
	if m, ok := errorMapping[parley.ErrorCode(err)]; ok {
		return m.status
	}
	return http.StatusInternalServerError
}

// closeCodeFor returns the WebSocket close code for err's code.
func closeCodeFor(err error) int {
	if m, ok := errorMapping[parley.ErrorCode(err)]; ok {
		return m.closeCode
	}
	return websocket.CloseInternalServerErr
}

// statusCode maps an HTTP status back to an error code, for errors that
// arrive as statuses (the upgrader's).
func statusCode(status int) string {
	for code, m := range errorMapping {
		if m.status == status && code != parley.EUnavailable {
			return code
		}
	}
	return parley.EInternal
}

// ErrorBody is the JSON error every HTTP endpoint returns.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	} `json:"error"`
}

func newErrorBody(code, msg, field string) ErrorBody {
	var b ErrorBody
	b.Error.Code, b.Error.Message, b.Error.Field = code, msg, field
	return b
}

func writeHTTPError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(newErrorBody(code, msg, ""))
}

// httpErrorHandler renders every error a handler returns, in one place.
func (s *Server) httpErrorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	status, code, msg, field := 0, "", "", ""
	if errors.As(err, &he) {
		status = he.Code
		code = statusCode(he.Code)
		msg = http.StatusText(he.Code)
		if m, ok := he.Message.(string); ok {
			msg = m
		}
	} else {
		status, code, msg = ErrorStatus(err), parley.ErrorCode(err), parley.ErrorMessage(err)
		var pe *parley.Error
		if errors.As(err, &pe) {
			field = pe.Field
		}
		if code == parley.EInternal {
			s.log.Error("request failed", zap.String("path", c.Request().URL.Path), zap.Error(err))
		}
	}
	if c.Request().Method == http.MethodHead {
		c.NoContent(status)
		return
	}
	c.JSON(status, newErrorBody(code, msg, field))
}
