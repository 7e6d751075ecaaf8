package responses

// Background responses (OpenAI's "background": true): the response runs on
// the server's context, not its request's, and its stream events are kept
// in a log, so a client may leave and come back:
//
//	GET  /v1/responses/:id                                  status in_progress while it runs
//	GET  /v1/responses/:id?stream=true&starting_after=N     its events after sequence_number N, then the rest live
//	POST /v1/responses/:id/cancel                           cancel it now
//
// A background response holds a connection admission of its client until
// it ends (like a chat reply going on without its socket), so a client
// cannot park more of them than it may hold connections. Its log is kept
// bgLinger after it ends, for a client that resumes the stream late; after
// that GET reads the stored response.

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// bgLinger is how long a finished background response's event log is kept.
const bgLinger = time.Minute

// bgEvent is one logged stream event.
type bgEvent struct {
	typ  string
	data []byte
}

// bgResponse is one background response: its event log (events[i] has
// sequence_number i) and its state.
type bgResponse struct {
	id     string
	user   string // whose it is: only that user finds it (apicore.Facts.Caller)
	cancel context.CancelFunc

	mu        sync.Mutex
	events    []bgEvent
	initial   *responseObject // as it was when it started: in_progress
	final     *responseObject // set when it has ended
	cancelled bool
	wake      chan struct{} // closed and replaced on every change
	ended     chan struct{}
}

// bgRegistry holds the background responses by id.
type bgRegistry struct {
	mu   sync.Mutex
	m    map[string]*bgResponse
	live atomic.Int64   // responses running
	wg   sync.WaitGroup // one per response until its log is dropped
}

// running counts the background responses still running (Close drains them).
func (g *bgRegistry) running() int { return int(g.live.Load()) }

// get returns user's background response id, or nil: another user's is
// not found, the same as an unknown id.
func (g *bgRegistry) get(user, id string) *bgResponse {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.m[id]; b != nil && b.user == user {
		return b
	}
	return nil
}

func (g *bgRegistry) put(b *bgResponse) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = make(map[string]*bgResponse)
	}
	g.m[b.id] = b
}

func (g *bgRegistry) drop(b *bgResponse) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[b.id] == b {
		delete(g.m, b.id)
	}
}

// emit logs one event; it never fails, so the response runs to its end
// whoever listens.
func (b *bgResponse) emit(typ string, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, bgEvent{typ: typ, data: data})
	close(b.wake)
	b.wake = make(chan struct{})
	return nil
}

// startBackground runs a created response in the background and answers
// the request: the response object (status in_progress) or, with stream,
// its events as they come (the response goes on when the client leaves).
func (s *API) startBackground(c echo.Context, pr *parsedResponse) error {
	if pr.req.NoStore {
		return parley.FieldErrorf("store", "must not be false with background: a background response is fetched by its id later")
	}
	who := pr.facts.Caller
	client := who.Client
	if err := s.sockets.Admit(client); err != nil {
		return err
	}
	user := who.User
	ctx, cancel := context.WithCancel(s.stop)
	pr.req.Durable = true // a crash leaves it stored, interrupted
	resp, err := s.respond(ctx, who, pr.req)
	if err != nil {
		cancel()
		s.sockets.Release(client)
		return pr.renameSent(err)
	}
	setAffinity(c, pr, resp)
	initial := s.newResponseObject(resp.Record, resp.SessionID(), resp.Stored, resp.Model)
	initial.Status = "in_progress"
	initial.Background = true
	pr.echo(initial, resp.SessionID())
	b := &bgResponse{id: resp.Record.ID, user: user, cancel: cancel, initial: initial, wake: make(chan struct{}), ended: make(chan struct{})}
	s.bg.put(b)
	s.bg.wg.Add(1)
	s.bg.live.Add(1)
	go s.runBackground(ctx, b, resp, pr, client)
	if !pr.stream {
		return c.JSON(http.StatusOK, initial)
	}
	return s.followBackground(c, b, -1)
}

// runBackground streams resp into b's log until it ends, then keeps the log
// bgLinger for late readers.
func (s *API) runBackground(ctx context.Context, b *bgResponse, resp *session.Response, pr *parsedResponse, client string) {
	defer s.bg.wg.Done()
	log := s.core.Log.With(zap.String("response", b.id), zap.String("session", resp.SessionID()))
	log.Info("background response started")
	_ = s.streamResponse(ctx, b.cancel, resp, pr, b.emit)
	final := s.finishedResponse(resp, pr)
	final.Background = true
	// It ran: the log that lingers holds no admission. Released before the
	// end is published, so that a client told it ended (its cancel
	// answered, its stream's last event read) has its room back at once.
	b.cancel()
	s.bg.live.Add(-1)
	s.sockets.Release(client)
	b.mu.Lock()
	if b.cancelled {
		final.Status = session.StatusCancelled
	}
	b.final = final
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
	close(b.ended)
	log.Info("background response ended", zap.String("status", final.Status))
	t := time.NewTimer(bgLinger)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.stop.Done():
	}
	s.bg.drop(b)
}

// followBackground writes b's events after sequence_number after as
// server-sent events, then the rest as they come, until b ends or the
// client leaves (b goes on).
func (s *API) followBackground(c echo.Context, b *bgResponse, after int) error {
	w := s.core.BeginStream(c, "text/event-stream")
	next := after + 1
	for {
		b.mu.Lock()
		evs, done, wake := b.events[min(next, len(b.events)):], b.final != nil, b.wake
		b.mu.Unlock()
		for _, ev := range evs {
			if err := w.Write([]byte("event: " + ev.typ + "\ndata: " + string(ev.data) + "\n\n")); err != nil {
				return nil // the client left; the response goes on
			}
		}
		next += len(evs)
		if done {
			return nil
		}
		select {
		case <-wake:
		case <-c.Request().Context().Done():
			return nil
		}
	}
}

// getBackground answers GET /v1/responses/:id for a background response
// this server runs or ran lately (false: not one; the stored response
// answers).
func (s *API) getBackground(c echo.Context) (bool, error) {
	b := s.bg.get(apicore.FactsOf(c).Caller.User, c.Param("id"))
	if b == nil {
		if c.QueryParam("stream") == "true" {
			return true, parley.Errorf(parley.EInvalid, "only a background response that is running (or ended in the last %v) can be streamed", bgLinger)
		}
		return false, nil
	}
	if c.QueryParam("stream") == "true" {
		after := -1
		if v := c.QueryParam("starting_after"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return true, parley.FieldErrorf("starting_after", "must be a whole number, 0 or more")
			}
			after = n
		}
		return true, s.followBackground(c, b, after)
	}
	b.mu.Lock()
	o := b.final
	if o == nil {
		o = b.initial
	}
	b.mu.Unlock()
	return true, c.JSON(http.StatusOK, o)
}

// CancelResponse is POST /v1/responses/:id/cancel: a running
// background response is cancelled at once (its text so far is stored);
// one that has ended is returned as it is.
func (s *API) CancelResponse(c echo.Context) error {
	id, who := c.Param("id"), apicore.FactsOf(c).Caller
	b := s.bg.get(who.User, id)
	if b == nil {
		if _, _, err := s.convs.GetResponse(c.Request().Context(), who, id); err != nil {
			return err
		}
		return parley.Errorf(parley.EInvalid, "only a background response can be cancelled")
	}
	b.mu.Lock()
	if b.final == nil {
		b.cancelled = true
		b.cancel()
	}
	b.mu.Unlock()
	t := time.NewTimer(apicore.SettleWait)
	defer t.Stop()
	select {
	case <-b.ended:
	case <-t.C:
		return parley.Errorf(parley.EUnavailable, "the response did not stop in time; try again")
	case <-c.Request().Context().Done():
		return c.Request().Context().Err()
	}
	b.mu.Lock()
	o := b.final
	b.mu.Unlock()
	return c.JSON(http.StatusOK, o)
}
