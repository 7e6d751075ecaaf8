package openai

import (
	"encoding/json"
	"fmt"

	"github.com/labstack/echo/v4"
	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/oaiwire"
	"go.uber.org/zap"
)

// openAIChunks makes the server-sent chunks of one OpenAI streaming API (chat
// or legacy completions); streamOpenAI owns the order and the rules.
type openAIChunks struct {
	first func() any                                // optional: the chunk before any text
	text  func(text string, lps []tokenLogprob) any // a chunk of reply text; lps: the logprobs of its tokens, when asked for
	// reasoning, optional, is a chunk of a reasoning model's thought (it precedes the answer's chunks).
	reasoning func(text string) any
	final     func(finish string, lps []tokenLogprob, timings apicore.Timings) any // the chunk with the finish reason
	usage     func(usage json.RawMessage) any                                      // the usage chunk (stream_options.include_usage)
}

// streamOpenAI relays call's reply as OpenAI server-sent events ("data:
// {chunk}" ... "data: [DONE]"); an error after the stream began is one
// OpenAI error event.
func (s *API) streamOpenAI(c echo.Context, call *apicore.Call, logprobs, includeUsage bool, ch openAIChunks) {
	w := s.core.BeginStream(c, "text/event-stream")
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode chunk: %w", err)
		}
		return w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
	}
	// Tokens whose text is held back (a partial character, a possible stop
	// string) or empty (special tokens) make no chunk of their own; their
	// logprobs ride with the next chunk.
	var pendingLP []tokenLogprob
	content := func(text string, t *parley.Token) error {
		if t != nil && t.Reasoning != "" && ch.reasoning != nil {
			if err := send(ch.reasoning(t.Reasoning)); err != nil {
				return err
			}
		}
		if logprobs && t != nil {
			pendingLP = append(pendingLP, tokenLogprobOf(*t, call.TopLogprobs))
		}
		if text == "" {
			return nil
		}
		lps := pendingLP
		pendingLP = nil
		return send(ch.text(text, lps))
	}
	if call.OnTool != nil {
		call.Tool = func(d parley.ToolCallDelta) error { return send(call.OnTool(d)) }
	}
	if ch.first != nil {
		if err := send(ch.first()); err != nil {
			call.Cancel()
			call.Collect()
			return
		}
	}
	err := call.Relay(
		func(t parley.Token, _ int) error { return content(t.Text, &t) },
		func(last *parley.Token, ev parley.Event) error {
			if last != nil {
				if err := content(last.Text, last); err != nil {
					return err
				}
			}
			if rerr := apicore.ReplyError(ev); rerr != nil {
				return send(oaiwire.ErrorBody{Error: oaiwire.NewError(rerr)})
			}
			if err := send(ch.final(openAIFinish(ev.Finish), pendingLP, apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens))); err != nil {
				return err
			}
			if includeUsage {
				u, err := json.Marshal(newOpenAIUsage(ev.Usage))
				if err != nil {
					return fmt.Errorf("encode usage: %w", err)
				}
				if err := send(ch.usage(u)); err != nil {
					return err
				}
			}
			return w.Write([]byte("data: [DONE]\n\n"))
		})
	if err != nil {
		s.core.Log.Debug("openai stream ended early", zap.String("route", call.Route), zap.Error(err))
	}
}
