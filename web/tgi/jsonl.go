package tgi

import (
	"encoding/json"
	"fmt"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// JSON lines, DJL Serving's streaming style, chosen per request with the
// format query parameter of POST /generate (the request body is TGI's,
// which DJL shares: {"inputs", "parameters"}):
//
//	?format=jsonlines             one object per generated token
//	                              {"token_id", "token_text", "token_log_prob", "token_special"}
//	?format=jsonlines-cumulative  one object per generated token
//	                              {"token_id", "generated_text"}: the whole text so far
//
// The response is application/jsonlines, one object and "\n" per line, a
// flush after each. The last line adds "finish_reason" (stop, length, eos,
// cancelled, error), "usage" and "timings", and "error" {code, message} when
// the reply failed. As in the TGI stream, the last line is the last token's
// own line when the reply ended on its token cap; otherwise it is an end
// line whose token_id is null (and, in the plain form, token_text is "").
//
// A query parameter rather than an Accept header: it shows in a URL, curl
// and logs, and a wrong value is a 400 naming it instead of a silent
// fallback to another format.
const (
	formatJSONLines           = "jsonlines"
	formatJSONLinesCumulative = "jsonlines-cumulative"
)

type jsonLine struct {
	TokenID       *int             `json:"token_id"`
	TokenText     *string          `json:"token_text,omitempty"`
	TokenLogProb  *float64         `json:"token_log_prob,omitempty"`
	TokenSpecial  *bool            `json:"token_special,omitempty"`
	GeneratedText *string          `json:"generated_text,omitempty"`
	FinishReason  string           `json:"finish_reason,omitempty"`
	Usage         *apicore.Usage   `json:"usage,omitempty"`
	Timings       *apicore.Timings `json:"timings,omitempty"`
	Error         *lineError       `json:"error,omitempty"`
}

type lineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// handleJSONLines streams a reply as JSON lines (see above).
func (s *API) handleJSONLines(c echo.Context, cumulative bool) error {
	tc, err := s.parseTGI(c)
	if err != nil {
		return err
	}
	route := formatJSONLines
	if cumulative {
		route = formatJSONLinesCumulative
	}
	call, err := s.core.StartCompletion(c, tc.facts, route, tc.inputs, tc.params)
	if err != nil {
		return apicore.PrefixField(err, "parameters.")
	}
	w := s.core.BeginStream(c, "application/jsonlines")
	var text []byte // generated text so far (cumulative form)
	line := func(t *parley.Token) jsonLine {
		if t == nil {
			empty := ""
			l := jsonLine{}
			if cumulative {
				full := string(text)
				l.GeneratedText = &full
			} else {
				l.TokenText = &empty
			}
			return l
		}
		id := t.ID
		l := jsonLine{TokenID: &id}
		if cumulative {
			text = append(text, t.Text...)
			full := string(text)
			l.GeneratedText = &full
		} else {
			txt, lp, sp := t.Text, apicore.Finite(t.Logprob), t.Special
			l.TokenText, l.TokenLogProb, l.TokenSpecial = &txt, &lp, &sp
		}
		return l
	}
	send := func(l jsonLine) error {
		b, err := json.Marshal(l)
		if err != nil {
			return fmt.Errorf("encode line: %w", err)
		}
		return w.Write(append(b, '\n'))
	}
	err = call.Relay(
		func(t parley.Token, _ int) error { return send(line(&t)) },
		func(last *parley.Token, ev parley.Event) error {
			l := line(last)
			usage, timings := apicore.NewUsage(ev.Usage), apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens)
			l.FinishReason, l.Usage, l.Timings = string(ev.Finish), &usage, &timings
			if rerr := apicore.ReplyError(ev); rerr != nil {
				l.Error = &lineError{Code: parley.ErrorCode(rerr), Message: parley.ErrorMessage(rerr)}
			}
			return send(l)
		})
	if err != nil {
		s.core.Log.Debug("json lines stream ended early", zap.Error(err))
	}
	return nil
}
