package web

import (
	"io"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// The bodies in flight: every request body is read whole into memory (the
// APIs decode JSON or take the text as the prompt), and a client may take
// BodyTimeout to send it, so without a bound a few hundred slow clients
// that each announce a large body would hold gigabytes. The body budget
// bounds the bytes of all bodies of the requests being handled at once, and
// the share of it one client key may hold; over either, a request is
// refused before its body is read (503 busy, or 429 rate_limited for one
// client's share), with Retry-After (the error's RetryAfter).
//
// A body with a Content-Length takes that many bytes of the budget before
// it is read (so a body that will not fit is refused at once, without being
// read); a chunked body takes its bytes as they arrive. Either holds them
// until its handler returns: the decoded request lives that long. The body
// is read into a buffer that grows with what arrives, never to more than
// the Content-Length, so a client that announces 4 MiB and sends nothing
// holds budget, not memory.

// Defaults of the body budget.
const (
	DefaultMaxBodyBytesInflight = 64 << 20 // bytes of all request bodies being handled at once
	DefaultMaxHTTPConnsPerIP    = 128      // open TCP connections per client address (above DefaultMaxConnsPerIP, so an address at its WebSocket cap can still call the APIs)
	// bodyShareDivisor: one client key may hold 1/bodyShareDivisor of the
	// body budget, at least one largest body.
	bodyShareDivisor = 4
	// chunkedStep is how much of the budget a chunked body takes at a time.
	chunkedStep = 64 << 10
)

// Refusal causes of the body budget and the per-address TCP cap.
const (
	refusedBodyBudget     = "body_budget"       // the global body budget is taken (code busy)
	refusedBodyShare      = "body_budget_share" // one client's share of it is taken (code rate_limited)
	refusedHTTPConnsPerIP = "http_conns_per_ip" // too many TCP connections from one address
)

// bodyBudget counts the bytes request bodies hold, in total and per client.
type bodyBudget struct {
	limit, share int64

	mu       sync.Mutex
	used     int64
	byClient map[string]int64
	peak     int64     // the most used since the last return of memory
	returned time.Time // when memory was last returned to the OS
}

// Returning memory after a burst: the buffers of bodies that ended are
// garbage, but with no allocation going on the collector may not run for
// minutes (its forced period is two), and the runtime returns freed pages
// to the OS only after that. So when the bodies in flight drop to none
// after holding at least returnAfter bytes, the last one to end collects
// and returns the pages, at most once per returnEvery.
const (
	returnAfter = 8 << 20
	returnEvery = 10 * time.Second
)

func newBodyBudget(limit int64) *bodyBudget {
	return &bodyBudget{limit: limit, share: max(limit/bodyShareDivisor, apicore.MaxBodyBytes), byClient: map[string]int64{}}
}

// Take reserves n bytes for client; the error is the refusal.
func (b *bodyBudget) Take(client string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byClient[client]+n > b.share {
		return withCause(refusedBodyShare, &parley.Error{Code: parley.ERateLimited, RetryAfter: time.Second,
			Message: "too many request bodies from your address are being received now; try again shortly"})
	}
	if b.used+n > b.limit {
		return withCause(refusedBodyBudget, &parley.Error{Code: parley.EBusy, RetryAfter: time.Second,
			Message: "the server is receiving too many request bodies now; try again shortly"})
	}
	b.used += n
	b.byClient[client] += n
	return nil
}

func (b *bodyBudget) Give(client string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.peak = max(b.peak, b.used)
	b.used -= n
	if b.byClient[client] -= n; b.byClient[client] <= 0 {
		delete(b.byClient, client)
	}
	burstEnded := b.used == 0 && b.peak >= returnAfter && time.Since(b.returned) >= returnEvery
	if burstEnded {
		b.peak, b.returned = 0, time.Now()
	}
	b.mu.Unlock()
	if burstEnded {
		debug.FreeOSMemory()
	}
}

func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// limitBodies is the middleware that makes each request's body take its
// bytes from the budget (see above) and gives them back when the handler
// returns. It runs after tagClient, whose client key it charges.
func (s *Server) limitBodies(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		client := apicore.FactsOfRequest(r).Caller.Client
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			return next(c)
		}
		if r.ContentLength > apicore.MaxBodyBytes {
			return parley.Errorf(parley.ETooLarge, "the request body is over %d bytes", apicore.MaxBodyBytes)
		}
		body := &budgetedBody{ReadCloser: r.Body, budget: s.bodies, client: client, declared: r.ContentLength}
		defer body.release()
		if r.ContentLength > 0 {
			if err := s.bodies.Take(client, r.ContentLength); err != nil {
				return err
			}
			body.held = r.ContentLength
		}
		r.Body = body
		return next(c)
	}
}

// budgetedBody is a request body that holds budget for what it may hold.
type budgetedBody struct {
	io.ReadCloser
	budget   *bodyBudget
	client   string
	declared int64 // Content-Length, or -1 (chunked)
	held     int64 // bytes taken from the budget
	read     int64
}

func (b *budgetedBody) Read(p []byte) (int, error) {
	if b.declared < 0 && b.read+int64(len(p)) > b.held {
		step := max(int64(chunkedStep), b.read+int64(len(p))-b.held)
		if err := b.budget.Take(b.client, step); err != nil {
			return 0, &apicore.BodyBudgetError{Refusal: err}
		}
		b.held += step
	}
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	return n, err
}

func (b *budgetedBody) release() {
	b.budget.Give(b.client, b.held)
	b.held = 0
}
