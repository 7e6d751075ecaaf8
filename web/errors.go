package web

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// wireStatus is the HTTP status of err on a route of shape: apicore.ErrorStatus,
// except that a prompt over a limit is a 400 on the OpenAI and Anthropic
// routes, as those APIs answer it (a 413 there reads as a body over the
// size limit: Claude Code asks to remove images, Codex retries).
func wireStatus(err error, shape errorShape) int {
	if _, _, ok := parley.PromptLimit(err); ok && (shape == shapeOpenAI || shape == shapeAnthropic) {
		return http.StatusBadRequest
	}
	return apicore.ErrorStatus(err)
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
	return apicore.NewErrorBody(err)
}

// writeHTTPError writes an error that arrives as a status (the WebSocket
// upgrader's) in r's route's shape.
func writeHTTPError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBodyFor(r, &parley.Error{Code: apicore.StatusCode(status), Message: msg}))
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
		err = &parley.Error{Code: apicore.StatusCode(he.Code), Message: msg}
	} else {
		status = wireStatus(err, errorShapeFor(c.Request()))
		if parley.ErrorCode(err) == parley.EInternal {
			s.log.Error("request failed", zap.String("path", c.Request().URL.Path), zap.Error(err))
		}
		if d := apicore.RetryAfterSeconds(err); d > 0 {
			c.Response().Header().Set("Retry-After", strconv.Itoa(d))
		}
	}
	if c.Request().Method == http.MethodHead {
		c.NoContent(status)
		return
	}
	c.JSON(status, errorBodyFor(c.Request(), err))
}
