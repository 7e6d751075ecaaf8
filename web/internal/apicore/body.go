package apicore

import (
	"errors"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
)

// MaxBodyBytes bounds an HTTP API request body. A prompt this long is far
// past any context window the engine serves, so nothing useful is refused;
// anything longer is refused (413) before it is read into memory.
const MaxBodyBytes = 4 << 20

// BodyBudgetError is what a chunked body's Read returns when the server's
// body budget has no room for its next bytes; ReadBody turns it into the
// refusal.
type BodyBudgetError struct{ Refusal error }

func (e *BodyBudgetError) Error() string { return "request body: " + e.Refusal.Error() }
func (e *BodyBudgetError) Unwrap() error { return e.Refusal }

// ReadBody reads the request body, refusing more than MaxBodyBytes.
// The read deadline the server set for the body is lifted once the body is
// in, so a long streamed reply is not cut by it.
//
// The body grows its buffer as bytes arrive (ReadAll), and its bytes were
// taken from the server's body budget; a chunked body the budget has no
// room for is refused mid-way, with Retry-After.
func ReadBody(c echo.Context) ([]byte, error) {
	r := http.MaxBytesReader(c.Response(), c.Request().Body, MaxBodyBytes)
	b, err := ReadAll(r, c.Request().ContentLength)
	var tooBig *http.MaxBytesError
	var budget *BodyBudgetError
	switch {
	case errors.As(err, &budget):
		return nil, budget.Refusal
	case errors.As(err, &tooBig):
		return nil, parley.Errorf(parley.ETooLarge, "the request body is over %d bytes", MaxBodyBytes)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, parley.Errorf(parley.EInvalid, "the request body did not arrive in time")
	case err == nil:
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Time{})
	case err != nil:
		return nil, parley.Errorf(parley.EInvalid, "reading the request body: %v", err)
	}
	return b, nil
}

// ReadAll reads a body into a buffer that grows with what arrives and
// never past the Content-Length (cl; -1 when unknown), so announcing a large
// body costs no memory until its bytes come.
func ReadAll(r io.Reader, cl int64) ([]byte, error) {
	const first = 16 << 10
	size := int64(first)
	if cl >= 0 {
		size = min(cl+1, first) // +1: see the end of the body without growing
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			next := int64(cap(buf)) * 2
			if cl >= 0 {
				next = min(next, cl+1)
			}
			if next <= int64(cap(buf)) {
				next = int64(cap(buf)) + first
			}
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
