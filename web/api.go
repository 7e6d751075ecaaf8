package web

// The HTTP streaming APIs: one engine, every client's convention.
//
//	POST /                      plain text, chunked (Ray Serve Textbot): ?prompt=... or a text body  (api_plain.go)
//	POST /generate              TGI, one JSON response                                                (api_tgi.go)
//	POST /generate_stream       TGI, server-sent events
//	POST /invocations           SageMaker: TGI's events when "stream": true, else [{"generated_text"}]
//	POST /generate?format=jsonlines             DJL-style JSON lines, one object per token           (api_jsonl.go)
//	POST /generate?format=jsonlines-cumulative  the same, each line carrying the text so far
//	POST /v1/chat/completions   OpenAI chat completions, streamed or not                              (api_openai.go)
//	POST /v1/completions        OpenAI legacy completions (raw prompt), streamed or not               (api_completions.go)
//	GET  /v1/models             OpenAI model list
//	POST /v1/messages           Anthropic Messages, streamed or not; /v1/messages/count_tokens          (api_anthropic.go)
//	/v1/responses, /v1/conversations  OpenAI's Responses and Conversations APIs over the sessions (api_responses.go)
//	/api/chat, /api/generate, /api/tags, /api/show, ...  Ollama's API (api_ollama*.go)
//
// Every endpoint but the Responses and Conversations APIs is stateless (the request carries the whole prompt or
// conversation), decodes its sampling parameters with the one paramsPatch
// decoder and validates them with resolveParams, so a bad value is the same
// 400 naming the field whatever the wire. Errors before the first byte of a
// reply are JSON errors from httpErrorHandler with the mapped status; errors
// after it are the format's own final error event. The request's context is
// the reply's: a client that goes away cancels its generation within one
// decode step.

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// maxAPIBodyBytes bounds an HTTP API request body. A prompt this long is far
// past any context window the engine serves, so nothing useful is refused;
// anything longer is refused (413) before it is read into memory.
const maxAPIBodyBytes = 4 << 20

// Responder is what the HTTP APIs need from the chat layer
// (*chat.Responder satisfies it). key ties a request to a KV-cache slot; ""
// is a stateless request. The caller must drain the reply's Events or cancel
// ctx.
type Responder interface {
	Reply(ctx context.Context, key string, msgs []parley.Message, p parley.Params) (*chat.Reply, error)
	Complete(ctx context.Context, key, prompt string, p parley.Params) (*chat.Reply, error)
}

// apiDeps is what the HTTP APIs run on; set by WithResponder and WithModelInfo.
type apiDeps struct {
	responder Responder
	modelInfo func() parley.ModelInfo // nil: the model is described by name only
	mounted   time.Time               // when the routes were mounted: the model's "created" for OpenAI clients
	convs     Conversations           // the Responses and Conversations APIs' sessions (api_responses.go); nil: not mounted
	items     itemSessions            // the sessions of recent stored responses, for item_reference inputs (api_responses_refs.go)
}

// WithResponder mounts the HTTP streaming APIs (plain, TGI/SageMaker, JSON
// lines, OpenAI) over r. Without it the server speaks WebSocket only.
func WithResponder(r Responder) Option {
	return func(s *Server) {
		if s.api.responder == nil {
			s.mounts = append(s.mounts, s.mountAPI)
		}
		s.api.responder = r
	}
}

// WithModelInfo gives the APIs the loaded model's facts (for /v1/models and
// the model name in responses).
func WithModelInfo(info func() parley.ModelInfo) Option {
	return func(s *Server) { s.api.modelInfo = info }
}

// mountAPI adds the API routes; RequireKey guards them all.
func (s *Server) mountAPI(e *echo.Echo) {
	s.api.mounted = time.Now()
	g := e.Group("", s.RequireKey)
	g.POST("/", s.handlePlain)
	g.POST("/generate", s.handleGenerate)
	g.POST("/generate_stream", s.handleGenerateStream)
	g.POST("/invocations", s.handleInvocations)
	g.POST("/v1/chat/completions", s.handleChatCompletions)
	g.POST("/v1/completions", s.handleCompletions)
	if s.models != nil {
		g.GET("/v1/models", anthropicOr(s.handleModelsList, s.handleAnthropicModels))
		g.GET("/v1/models/:id", anthropicOr(s.handleModelsOne, s.handleAnthropicModel))
		s.mountAdmin(g)
	} else {
		g.GET("/v1/models", anthropicOr(s.handleModels, s.handleAnthropicModels))
		g.GET("/v1/models/:id", anthropicOr(s.handleModel, s.handleAnthropicModel))
	}
	g.POST("/v1/messages", s.handleMessages)
	g.POST("/v1/messages/count_tokens", s.handleCountTokens)
	if cs, ok := s.sessions.(Conversations); ok {
		s.mountResponses(g, cs)
	}
	s.mountOllama(e, g)
}

// modelName is the id clients see for the model of a request (ctx, see
// pickModel): the loaded model's with one model.
func (s *Server) modelName(ctx context.Context) string {
	name, _ := s.modelFor(ctx)
	return name
}

// apiAvailable refuses requests while the model loads or the server drains.
func (s *Server) apiAvailable() error {
	if !s.ready.Load() {
		return parley.Errorf(parley.EUnavailable, "the model is loading; try again shortly")
	}
	if s.draining.Load() {
		return parley.Errorf(parley.EUnavailable, "the server is shutting down")
	}
	return nil
}

// readBody reads the request body, refusing more than maxAPIBodyBytes.
// The read deadline bodyDeadline set is lifted once the body is in, so a
// long streamed reply is not cut by it.
//
// The body grows its buffer as bytes arrive (readAll), and its bytes were
// taken from the body budget by limitBodies; a chunked body the budget has
// no room for is refused mid-way, with Retry-After.
func readBody(c echo.Context) ([]byte, error) {
	r := http.MaxBytesReader(c.Response(), c.Request().Body, maxAPIBodyBytes)
	b, err := readAll(r, c.Request().ContentLength)
	var tooBig *http.MaxBytesError
	var budget *errBodyBudget
	switch {
	case errors.As(err, &budget):
		return nil, budget.refusal
	case errors.As(err, &tooBig):
		return nil, parley.Errorf(parley.ETooLarge, "the request body is over %d bytes", maxAPIBodyBytes)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, parley.Errorf(parley.EInvalid, "the request body did not arrive in time")
	case err == nil:
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Time{})
	case err != nil:
		return nil, parley.Errorf(parley.EInvalid, "reading the request body: %v", err)
	}
	return b, nil
}

// patchFromQuery turns sampling parameters given as query parameters
// (?max_tokens=20&temperature=0&stop=.) into a paramsPatch, through the same
// JSON decoder every other wire uses: each value is a JSON number, boolean
// or null when it parses as one and a JSON string otherwise, so
// temperature=hot is the usual 400 naming temperature. Repeated keys are an
// array (several stop strings). Keys that are not parameters are ignored.
func patchFromQuery(q url.Values, skip ...string) (*paramsPatch, error) {
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for key, vals := range q {
		if len(vals) == 0 || contains(skip, key) {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(jsonString(key))
		b.WriteByte(':')
		if len(vals) > 1 {
			b.WriteByte('[')
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(queryJSONValue(v))
		}
		if len(vals) > 1 {
			b.WriteByte(']')
		}
	}
	b.WriteByte('}')
	var p paramsPatch
	if err := decodeJSON(strings.NewReader(b.String()), &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func queryJSONValue(v string) string {
	switch v {
	case "true", "false", "null":
		return v
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) &&
		!strings.ContainsAny(v, "xXpP_") && strings.TrimSpace(v) == v {
		// ParseFloat also takes hex and underscores, which JSON does not.
		return v
	}
	return jsonString(v)
}

// jsonString is s as a JSON string (strconv.Quote's \x escapes are not JSON).
func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals; invalid UTF-8 becomes U+FFFD
	return string(b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// resolveSeed fixes the seed of a sampled reply that asked for a random one,
// so the seed can be reported (TGI's details.seed) and logged, and the reply
// reproduced. Greedy replies need no seed.
func resolveSeed(p *parley.Params) {
	if p.Seed < 0 && p.Temperature > 0 {
		p.Seed = int64(rand.Uint32N(math.MaxUint32)) // [0, 2^32-2]: 2^32-1 means "random" to llama.cpp
	}
}

// apiCall is one API request's reply in flight.
type apiCall struct {
	srv    *Server
	route  string
	cancel context.CancelFunc // cancels the reply (its context is the request's, which ends when the client goes away)
	rep    *chat.Reply
	params parley.Params
	meter  *replyMeter // metrics: every event of the reply passes through it
	// topLogprobs is how many top_logprobs an OpenAI client asked for.
	topLogprobs int
	// onTool makes a streamed tool-call delta's chunk (nil: the wire has
	// none); tool, set by the stream, sends it. relay calls tool before the
	// token of the event that carries the delta.
	onTool func(d parley.ToolCallDelta) any
	tool   func(d parley.ToolCallDelta) error
}

// startCompletion starts a raw-prompt reply (no template) for route.
func (s *Server) startCompletion(c echo.Context, route, prompt string, p parley.Params) (*apiCall, error) {
	return s.startCall(c, route, prompt, 0, p, func(ctx context.Context, r Responder) (*chat.Reply, error) {
		return r.Complete(ctx, "", prompt, p)
	})
}

// startChat starts a reply to a conversation rendered with the model's template.
// The whole prompt (every message and tool, and what the template adds) is
// held to Config.MaxPromptTokens: counted first from the request's strings
// (startCall), then, rendered, by the responder.
func (s *Server) startChat(c echo.Context, route, key string, msgs []parley.Message, p parley.Params) (*apiCall, error) {
	return s.startCall(c, route, promptText(msgs, p.Tools), len(msgs), p, func(ctx context.Context, r Responder) (*chat.Reply, error) {
		if s.cfg.MaxPromptTokens > 0 && s.tok != nil {
			ctx = parley.WithMaxPromptTokens(ctx, s.cfg.MaxPromptTokens)
		}
		return r.Reply(ctx, key, msgs, p)
	})
}

// startCall starts a reply for route once the server takes work and the
// request's text (the prompt, or every string of a conversation: a
// stateless request's whole prompt) plus extra tokens (one per message) is
// within Config.MaxPromptTokens.
func (s *Server) startCall(c echo.Context, route, text string, extra int, p parley.Params, start func(context.Context, Responder) (*chat.Reply, error)) (*apiCall, error) {
	if err := s.apiAvailable(); err != nil {
		return nil, err
	}
	if err := s.countPromptTokens(c.Request().Context(), text, extra, true); err != nil {
		return nil, err
	}
	// These APIs store nothing: the engine keeps no copy of their KV state
	// beyond the slot (a conversation key only leads a resent conversation
	// back to its slot).
	ctx, cancel := context.WithCancel(parley.WithStateless(c.Request().Context()))
	if s.models != nil && strings.HasSuffix(route, "-stream") {
		ctx = parley.WithLoadProgress(ctx, s.sseProgress(c))
	}
	call := &apiCall{srv: s, route: route, cancel: cancel, params: p, meter: s.meterReply(s.requestCancelCause).forModel(parley.ModelFrom(ctx))}
	rep, err := start(ctx, s.api.responder)
	if err != nil && c.Request().Context().Err() != nil && errors.Is(err, context.Canceled) {
		// The client left while its prompt was rendered or tokenized:
		// not a failure of the server's.
		err = parley.Errorf(parley.EUnavailable, "the request was cancelled before its reply started")
	}
	if err != nil {
		cancel()
		if c.Response().Committed { // the stream began with load progress: end it with the error
			s.sseError(c, err)
		}
		s.log.Info("reply refused", zap.String("route", route),
			zap.String("code", parley.ErrorCode(err)), zap.String("reason", parley.ErrorMessage(err)))
		return nil, err
	}
	call.rep = rep
	return call, nil
}

// relay passes the reply's events to the wire in order: token for each token
// event (index counts tokens from 1), final for the last event. When a token
// is known to be the last one (it reaches the reply cap, so the final event
// follows at once) it is held and given to final as last, so formats that
// mark the last token's own line or event with the finish reason can; in
// every other case last is nil and the format writes an end marker of its
// own. A write error (the client went away) cancels generation and ends the
// relay: after cancelling, the reply need not be drained.
//
// relay always returns with the reply either finished or cancelled.
func (a *apiCall) relay(token func(t parley.Token, index int) error, final func(last *parley.Token, ev parley.Event) error) error {
	defer a.cancel()
	n := 0
	var held *parley.Token
	for ev := range a.rep.Events() {
		a.meter.observe(ev)
		if ev.Done {
			a.logReply(ev)
			return final(held, ev)
		}
		n++
		if ev.ToolCall != nil && a.tool != nil {
			if err := a.tool(*ev.ToolCall); err != nil {
				a.cancel()
				a.drain()
				return err
			}
		}
		if n == a.params.MaxTokens {
			t := ev.Token
			held = &t
			continue
		}
		if err := token(ev.Token, n); err != nil {
			// The client went away: stop generating, and drain (quickly:
			// a cancelled reply delivers only its final event) to log it.
			a.cancel()
			for ev := range a.rep.Events() {
				a.meter.observe(ev)
				if ev.Done {
					a.logReply(ev)
				}
			}
			return err
		}
	}
	// Unreachable by the Reply's contract (one Done event ends every stream).
	return chat.ErrNoFinalEvent
}

// drain reads what is left of a cancelled reply (quickly: it delivers only
// its final event) to log it.
func (a *apiCall) drain() {
	for ev := range a.rep.Events() {
		a.meter.observe(ev)
		if ev.Done {
			a.logReply(ev)
		}
	}
}

// collect reads the whole reply, for the non-streaming forms. It returns
// the token events and the final event.
func (a *apiCall) collect() ([]parley.Token, parley.Event) {
	defer a.cancel()
	var toks []parley.Token
	for ev := range a.rep.Events() {
		a.meter.observe(ev)
		if ev.Done {
			a.logReply(ev)
			return toks, ev
		}
		toks = append(toks, ev.Token)
	}
	return toks, parley.Event{Done: true, Finish: parley.FinishError, Err: chat.ErrNoFinalEvent}
}

// logReply writes the reply's log line (replyLog) with its route first and
// its seed, when the request fixed one.
func (a *apiCall) logReply(ev parley.Event) {
	var seed []zap.Field
	if a.params.Seed >= 0 {
		seed = append(seed, zap.Int64("seed", a.params.Seed))
	}
	replyLog(a.srv.log.With(zap.String("route", a.route)), ev, seed...)
}

// replyError is the error a reply that did not finish normally reports on
// the wire: the engine's error, or, for a reply cancelled while its client
// is still there, the server's shutdown. nil for a normal finish.
func replyError(ev parley.Event) error {
	switch ev.Finish {
	case parley.FinishError:
		return errOr(ev.Err)
	case parley.FinishCancelled:
		return parley.Errorf(parley.EUnavailable, "the reply was cancelled: the server is shutting down")
	}
	return nil
}

// streamWriter writes a streamed response and flushes after every write, so
// each token leaves at once. Every write has a deadline (Config.WriteWait):
// a client that stops reading fails the write once the socket's buffers are
// full, which cancels its generation instead of holding the handler forever.
type streamWriter struct {
	res  *echo.Response
	rc   *http.ResponseController
	wait time.Duration
}

// beginStream sends the status and headers of a streamed response.
func (s *Server) beginStream(c echo.Context, contentType string) *streamWriter {
	if c.Response().Committed { // begun by sseProgress while the model loaded
		return &streamWriter{res: c.Response(), rc: http.NewResponseController(c.Response().Writer), wait: s.cfg.WriteWait}
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w := &streamWriter{res: c.Response(), rc: http.NewResponseController(c.Response().Writer), wait: s.cfg.WriteWait}
	w.deadline()
	c.Response().WriteHeader(http.StatusOK)
	c.Response().Flush()
	return w
}

// deadline pushes the write deadline; a writer that cannot have one (not a
// net/http connection) goes without.
func (w *streamWriter) deadline() {
	if w.wait > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.wait))
	}
}

func (w *streamWriter) write(b []byte) error {
	w.deadline()
	if _, err := w.res.Write(b); err != nil {
		return err
	}
	if err := w.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}
