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
	"github.com/parley-chat/parley/web/anthropic"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/ollama"
	"github.com/parley-chat/parley/web/openai"
	"github.com/parley-chat/parley/web/tgi"
)

// errorWire is how one family answers an error: its body and its status.
type errorWire struct {
	body   func(err error) any
	status func(err error) int
}

// The error wires of the families. Parley's own is the core's body with
// the core's status; TGI's and Ollama's change only the body.
var (
	parleyErrors    = errorWire{func(err error) any { return apicore.NewErrorBody(err) }, apicore.ErrorStatus}
	openAIErrors    = errorWire{openai.ErrorBody, openai.Status}
	anthropicErrors = errorWire{anthropic.ErrorBody, anthropic.Status}
	tgiErrors       = errorWire{tgi.ErrorBody, apicore.ErrorStatus}
	ollamaErrors    = errorWire{ollama.ErrorBody, apicore.ErrorStatus}
)

// errorWireFor is the error wire of r's route: Anthropic's under
// /v1/messages and for Anthropic's clients (anthropic-version) anywhere
// under /v1/, OpenAI's elsewhere under /v1/, Ollama's under /api/, TGI's on
// TGI's and SageMaker's routes (but not /generate's JSON lines, which are
// Parley's), Parley's everywhere else. It goes by the path, not the route
// matched, so a request refused before routing (an unknown path, a host
// or key refusal) is answered in the shape its client reads.
func errorWireFor(r *http.Request) errorWire {
	switch p := r.URL.Path; {
	case p == "/v1/messages" || strings.HasPrefix(p, "/v1/messages/"),
		strings.HasPrefix(p, "/v1/") && anthropic.IsClient(r):
		return anthropicErrors
	case strings.HasPrefix(p, "/v1/"):
		return openAIErrors
	case strings.HasPrefix(p, "/api/"):
		return ollamaErrors
	case p == "/generate_stream" || p == "/invocations":
		return tgiErrors
	case p == "/generate" && r.URL.Query().Get("format") == "":
		return tgiErrors
	}
	return parleyErrors
}

// errorBodyFor is err as the JSON body of r's route.
func errorBodyFor(r *http.Request, err error) any { return errorWireFor(r).body(err) }

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
		status = errorWireFor(c.Request()).status(err)
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
