package tgi

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Trailers of the plain stream: what a text body cannot carry. Declared
// before the body, sent after it (HTTP/1.1 chunked trailers).
const (
	trailerFinish      = "X-Parley-Finish-Reason"
	trailerUsage       = "X-Parley-Usage"   // prompt=N, cached=N, completion=N
	trailerTimings     = "X-Parley-Timings" // ttft_ms=N, tokens_per_second=N
	trailerError       = "X-Parley-Error"   // the error message when finish is error or cancelled
	headerPromptTokens = "X-Parley-Prompt-Tokens"
)

// Plain is POST / (the Ray Serve Textbot convention): the prompt is
// ?prompt=... or, without it, the request body as text; sampling parameters
// may follow as query parameters (?max_tokens=20&temperature=0&stop=.).
// The reply streams as text/plain in chunks, one flush per token; the
// finish reason, usage and timings follow as trailers. A failure after the
// stream began ends the text with a line "Error: ..." (as the WebSocket text
// mode does) and the X-Parley-Error trailer.
func (s *API) Plain(c echo.Context) error {
	q := c.Request().URL.Query()
	prompt, fromQuery := q.Get("prompt"), q.Has("prompt")
	if !fromQuery {
		body, err := apicore.ReadBody(c)
		if err != nil {
			return err
		}
		if !utf8.Valid(body) {
			return parley.FieldErrorf("prompt", "must be UTF-8 text")
		}
		prompt = string(body)
	}
	if strings.TrimSpace(prompt) == "" {
		return parley.FieldErrorf("prompt", "is required: POST /?prompt=... or the prompt as the request body")
	}
	facts := apicore.FactsOf(c)
	var err error
	if facts.Model, err = s.core.ResolveModel(q.Get("model")); err != nil {
		return err
	}
	patch, err := apicore.PatchFromQuery(q, "prompt", "model")
	if err != nil {
		return err
	}
	p, err := s.core.ResolveParams(patch)
	if err != nil {
		return err
	}
	apicore.ResolveSeed(&p)
	p.SkipLogprobs = true // plain text carries no logprobs
	call, err := s.core.StartCompletion(c, facts, "plain", prompt, p)
	if err != nil {
		return err
	}

	h := c.Response().Header()
	h.Set(headerPromptTokens, strconv.Itoa(call.Rep.PromptTokens()))
	h.Set("Trailer", strings.Join([]string{trailerFinish, trailerUsage, trailerTimings, trailerError}, ", "))
	w := s.core.BeginStream(c, "text/plain; charset=utf-8")
	err = call.Relay(
		func(t parley.Token, _ int) error {
			if t.Text == "" {
				return nil
			}
			return w.Write([]byte(t.Text))
		},
		func(last *parley.Token, ev parley.Event) error {
			if last != nil && last.Text != "" {
				if err := w.Write([]byte(last.Text)); err != nil {
					return err
				}
			}
			h.Set(trailerFinish, string(ev.Finish))
			h.Set(trailerUsage, "prompt="+strconv.Itoa(ev.Usage.PromptTokens)+
				", cached="+strconv.Itoa(ev.Usage.CachedPromptTokens)+
				", completion="+strconv.Itoa(ev.Usage.CompletionTokens))
			t := apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens)
			h.Set(trailerTimings, "ttft_ms="+strconv.FormatFloat(t.TTFTMS, 'f', -1, 64)+
				", tokens_per_second="+strconv.FormatFloat(t.TokensPerSecond, 'f', -1, 64))
			if rerr := apicore.ReplyError(ev); rerr != nil {
				h.Set(trailerError, parley.ErrorMessage(rerr))
				return w.Write([]byte("\nError: " + parley.ErrorMessage(rerr) + "\n"))
			}
			return nil
		})
	if err != nil {
		s.core.Log.Debug("plain stream ended early", zap.Error(err))
	}
	return nil
}
