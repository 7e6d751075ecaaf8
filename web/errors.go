package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// errorMapping is the one table from error codes to what each wire shows.
var errorMapping = map[string]struct {
	status        int    // HTTP status
	closeCode     int    // WebSocket close code when the error ends a connection
	openAIType    string // OpenAI's error "type" (its client libraries pick their exception class by the status)
	tgiType       string // TGI's ErrorResponse.error_type
	anthropicType string // Anthropic's error "type"
}{
	parley.EInvalid:      {http.StatusBadRequest, websocket.ClosePolicyViolation, "invalid_request_error", "validation", "invalid_request_error"},
	parley.ETooLarge:     {http.StatusRequestEntityTooLarge, websocket.CloseMessageTooBig, "invalid_request_error", "validation", "request_too_large"},
	parley.EBusy:         {http.StatusServiceUnavailable, websocket.CloseTryAgainLater, "server_error", "overloaded", "overloaded_error"},
	parley.ERateLimited:  {http.StatusTooManyRequests, websocket.ClosePolicyViolation, "rate_limit_error", "overloaded", "rate_limit_error"},
	parley.ENotFound:     {http.StatusNotFound, websocket.ClosePolicyViolation, "invalid_request_error", "validation", "not_found_error"},
	parley.EUnauthorized: {http.StatusUnauthorized, websocket.ClosePolicyViolation, "authentication_error", "validation", "authentication_error"},
	parley.EForbidden:    {http.StatusForbidden, websocket.ClosePolicyViolation, "permission_error", "validation", "permission_error"},
	parley.EUnavailable:  {http.StatusServiceUnavailable, websocket.CloseGoingAway, "server_error", "overloaded", "overloaded_error"},
	parley.EInternal:     {http.StatusInternalServerError, websocket.CloseInternalServerErr, "server_error", "generation", "api_error"},
	// A full session store is not the client's fault (4xx) nor a fault of
	// the server (500): 507 says the server cannot store what the request
	// needs, which is exactly the case, and a client backs off on it.
	parley.EStoreFull: {http.StatusInsufficientStorage, websocket.CloseTryAgainLater, "server_error", "overloaded", "api_error"},
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

// retryAfterSeconds is err's RetryAfter in whole seconds, rounded up (0:
// none).
func retryAfterSeconds(err error) int {
	d := parley.RetryAfter(err)
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// ErrorBody is the JSON error of Parley's own endpoints (the WebSocket
// upgrade, the plain-text and JSON-lines APIs, /info). The OpenAI and TGI
// routes answer in their own conventions' shapes (errorShape).
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

// newOpenAIError is err in OpenAI's shape. A prompt over a limit is
// OpenAI's context_length_exceeded, worded as OpenAI words it (clients
// such as Codex match the code and trim their history), Parley's message
// after it.
func newOpenAIError(err error) openAIError {
	code := parley.ErrorCode(err)
	e := openAIError{Message: parley.ErrorMessage(err), Type: errorMapping[code].openAIType, Code: &code}
	if e.Type == "" {
		e.Type = "server_error"
	}
	if f := errorField(err); f != "" {
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

// wireStatus is the HTTP status of err on a route of shape: ErrorStatus,
// except that a prompt over a limit is a 400 on the OpenAI and Anthropic
// routes, as those APIs answer it (a 413 there reads as a body over the
// size limit: Claude Code asks to remove images, Codex retries).
func wireStatus(err error, shape errorShape) int {
	if _, _, ok := parley.PromptLimit(err); ok && (shape == shapeOpenAI || shape == shapeAnthropic) {
		return http.StatusBadRequest
	}
	return ErrorStatus(err)
}

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

// newAnthropicError is err in Anthropic's shape. A prompt over a limit is
// an invalid_request_error worded as Anthropic words it ("prompt is too
// long: N tokens > M maximum", which Claude Code matches to compact its
// conversation), Parley's message after it.
func newAnthropicError(err error) anthropicError {
	if tokens, limit, ok := parley.PromptLimit(err); ok {
		return anthropicError{Type: "invalid_request_error",
			Message: fmt.Sprintf("prompt is too long: %d tokens > %d maximum (%s)", tokens, limit, parley.ErrorMessage(err))}
	}
	t := errorMapping[parley.ErrorCode(err)].anthropicType
	if t == "" {
		t = "api_error"
	}
	return anthropicError{Type: t, Message: parley.ErrorMessage(err)}
}

// tgiError is TGI's error (router/src/lib.rs ErrorResponse), before a
// stream and as a stream's last event.
type tgiError struct {
	Error     string `json:"error"`
	ErrorType string `json:"error_type"`
}

func newTGIError(err error) tgiError {
	t := errorMapping[parley.ErrorCode(err)].tgiType
	if t == "" {
		t = "generation"
	}
	return tgiError{Error: parley.ErrorMessage(err), ErrorType: t}
}

// errorField is the request field err names, "" when none.
func errorField(err error) string {
	var pe *parley.Error
	if errors.As(err, &pe) {
		return pe.Field
	}
	return ""
}

// An errorShape is a wire convention's error body.
type errorShape int

const (
	shapeParley    errorShape = iota // {"error": {"code", "message", "field"}}
	shapeOpenAI                      // {"error": {"message", "type", "param", "code"}}
	shapeTGI                         // {"error": "...", "error_type": "..."}
	shapeOllama                      // {"error": "..."}
	shapeAnthropic                   // {"type": "error", "error": {"type", "message"}}
)

// errorShapeFor is the shape of errors on r's route: Anthropic's under
// /v1/messages and for Anthropic's clients (anthropic-version) anywhere
// under /v1/, OpenAI's elsewhere under /v1/, TGI's on TGI's and SageMaker's routes (but not /generate's JSON lines,
// which are Parley's), Parley's everywhere else.
func errorShapeFor(r *http.Request) errorShape {
	switch p := r.URL.Path; {
	case p == "/v1/messages" || strings.HasPrefix(p, "/v1/messages/"),
		strings.HasPrefix(p, "/v1/") && isAnthropicClient(r):
		return shapeAnthropic
	case strings.HasPrefix(p, "/v1/"):
		return shapeOpenAI
	case strings.HasPrefix(p, "/api/"):
		return shapeOllama
	case p == "/generate_stream" || p == "/invocations":
		return shapeTGI
	case p == "/generate" && r.URL.Query().Get("format") == "":
		return shapeTGI
	}
	return shapeParley
}

// errorBodyFor is err as the JSON body of r's route.
func errorBodyFor(r *http.Request, err error) any {
	switch errorShapeFor(r) {
	case shapeOpenAI:
		return openAIErrorBody{newOpenAIError(err)}
	case shapeTGI:
		return newTGIError(err)
	case shapeOllama:
		return ollamaError{parley.ErrorMessage(err)}
	case shapeAnthropic:
		return anthropicErrorBody{Type: "error", Error: newAnthropicError(err)}
	}
	return newErrorBody(parley.ErrorCode(err), parley.ErrorMessage(err), errorField(err))
}

// writeHTTPError writes an error that arrives as a status (the WebSocket
// upgrader's) in r's route's shape.
func writeHTTPError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBodyFor(r, &parley.Error{Code: statusCode(status), Message: msg}))
}

// httpErrorHandler renders every error a handler returns, in one place.
func (s *Server) httpErrorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	status := 0
	if errors.As(err, &he) {
		status = he.Code
		msg := http.StatusText(he.Code)
		if m, ok := he.Message.(string); ok {
			msg = m
		}
		err = &parley.Error{Code: statusCode(he.Code), Message: msg}
	} else {
		status = wireStatus(err, errorShapeFor(c.Request()))
		if parley.ErrorCode(err) == parley.EInternal {
			s.log.Error("request failed", zap.String("path", c.Request().URL.Path), zap.Error(err))
		}
		if d := retryAfterSeconds(err); d > 0 {
			c.Response().Header().Set("Retry-After", strconv.Itoa(d))
		}
	}
	if c.Request().Method == http.MethodHead {
		c.NoContent(status)
		return
	}
	c.JSON(status, errorBodyFor(c.Request(), err))
}
