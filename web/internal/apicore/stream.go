package apicore

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
)

// StreamWriter writes a streamed response and flushes after every write, so
// each token leaves at once. Every write has a deadline (Core.WriteWait):
// a client that stops reading fails the write once the socket's buffers are
// full, which cancels its generation instead of holding the handler forever.
type StreamWriter struct {
	res  *echo.Response
	rc   *http.ResponseController
	wait time.Duration
}

// BeginStream sends the status and headers of a streamed response.
func (k *Core) BeginStream(c echo.Context, contentType string) *StreamWriter {
	if c.Response().Committed { // begun by SSEProgress while the model loaded
		return &StreamWriter{res: c.Response(), rc: http.NewResponseController(c.Response().Writer), wait: k.WriteWait}
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w := &StreamWriter{res: c.Response(), rc: http.NewResponseController(c.Response().Writer), wait: k.WriteWait}
	w.deadline()
	c.Response().WriteHeader(http.StatusOK)
	c.Response().Flush()
	return w
}

// deadline pushes the write deadline; a writer that cannot have one (not a
// net/http connection) goes without.
func (w *StreamWriter) deadline() {
	if w.wait > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.wait))
	}
}

// Write writes b and flushes it.
func (w *StreamWriter) Write(b []byte) error {
	w.deadline()
	if _, err := w.res.Write(b); err != nil {
		return err
	}
	if err := w.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// SSEProgress shows a streamed request that waits for its model to load
// the load's progress: it begins the event stream and writes SSE comments
// (": loading model NAME 42%"), which every SSE client ignores, so the
// client sees bytes at once and proxies do not time the request out. It
// runs on the request's goroutine (the registry's wait).
func (k *Core) SSEProgress(c echo.Context) parley.LoadProgress {
	var w *StreamWriter
	last := -1
	return func(model string, frac float64) {
		pct := int(frac * 100)
		if pct == last {
			return
		}
		last = pct
		if w == nil {
			w = k.BeginStream(c, "text/event-stream")
		}
		_ = w.Write([]byte(fmt.Sprintf(": loading model %s %d%%\n\n", model, pct)))
	}
}

// SSEError ends a stream that SSEProgress began with err, as one data
// event carrying the error body the request would have had as JSON.
func (k *Core) SSEError(c echo.Context, err error) {
	b, _ := json.Marshal(k.ErrorBody(c.Request(), err))
	w := &StreamWriter{res: c.Response(), rc: http.NewResponseController(c.Response().Writer), wait: k.WriteWait}
	_ = w.Write([]byte("event: error\ndata: " + string(b) + "\n\n"))
}
