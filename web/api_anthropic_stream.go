package web

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// A streamed Messages reply, as Anthropic's server-sent events:
//
//	message_start          the message, content empty, usage so far (the prompt's tokens)
//	ping
//	content_block_start    index 0, a text block, at the first text
//	content_block_delta    text_delta, one per piece of text
//	content_block_stop
//	message_delta          stop_reason, stop_sequence, and the whole usage
//	message_stop
//
// While nothing else is written (a long prompt being evaluated before the
// first token) a ping goes out every anthropicPingEvery, or 9/10 of
// Config.PongWait when that is shorter, as Anthropic's API sends them: a
// proxy that drops idle connections (nginx after 60 s by default) keeps
// the stream, and a client that left is noticed at the next ping, which
// cancels its reply.
//
// A reply with no content block, as the whole message then has
// no content. message_start cannot say how much of the prompt came from the
// KV cache (the engine reports it with the reply's end): it counts the
// whole prompt as input_tokens, and message_delta carries the final
// input_tokens and cache_read_input_tokens, which the SDKs' accumulators
// take over, so a streamed message ends equal to the whole one. An error
// after the stream began is an "error" event.

// anthropicPingEvery is the longest a stream stays silent.
const anthropicPingEvery = 15 * time.Second

// anthropicEvent is one event of the stream; Type is also its SSE event name.
type anthropicEvent struct {
	Type         string               `json:"type"`
	Message      *anthropicMessageOut `json:"message,omitempty"`
	Index        *int                 `json:"index,omitempty"`
	ContentBlock *anthropicText       `json:"content_block,omitempty"`
	Delta        any                  `json:"delta,omitempty"`
	Usage        *anthropicUsage      `json:"usage,omitempty"`
	Error        *anthropicError      `json:"error,omitempty"`
}

type anthropicTextDelta struct {
	Type string `json:"type"` // "text_delta"
	Text string `json:"text"`
}

type anthropicMessageDelta struct {
	StopReason   string          `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	StopDetails  json.RawMessage `json:"stop_details"`
}

// streamAnthropic relays call's reply as Anthropic's events.
func (s *Server) streamAnthropic(c echo.Context, call *apiCall, ac *anthropicCall, id, model string) {
	w := &anthropicWriter{w: s.beginStream(c, "text/event-stream")}
	send := w.send
	defer w.keepAlive(min(anthropicPingEvery, s.pingPeriod()), call.cancel)()
	zero := 0
	started := false // the text block was opened
	text := func(t string) error {
		if t == "" {
			return nil
		}
		if !started {
			started = true
			if err := send(anthropicEvent{Type: "content_block_start", Index: &zero, ContentBlock: &anthropicText{Type: "text", Text: ""}}); err != nil {
				return err
			}
		}
		return send(anthropicEvent{Type: "content_block_delta", Index: &zero, Delta: anthropicTextDelta{Type: "text_delta", Text: t}})
	}
	start := anthropicMessageOut{ID: id, Type: "message", Role: "assistant", Model: model, Content: []anthropicText{},
		StopDetails: json.RawMessage("null"), Usage: anthropicUsage{InputTokens: call.rep.PromptTokens()}}
	if err := send(anthropicEvent{Type: "message_start", Message: &start}); err != nil || send(anthropicEvent{Type: "ping"}) != nil {
		call.cancel()
		call.collect()
		return
	}
	err := call.relay(
		func(t parley.Token, _ int) error { return text(t.Text) },
		func(last *parley.Token, ev parley.Event) error {
			if last != nil {
				if err := text(last.Text); err != nil {
					return err
				}
			}
			if rerr := replyError(ev); rerr != nil {
				e := newAnthropicError(ac.patch.renameSent(rerr))
				return send(anthropicEvent{Type: "error", Error: &e})
			}
			if started {
				if err := send(anthropicEvent{Type: "content_block_stop", Index: &zero}); err != nil {
					return err
				}
			}
			reason, seq := anthropicStop(ev, call.rep.StopSequence(), ac.stops, ac.params.MaxTokens)
			u := newAnthropicUsage(ev.Usage)
			delta := anthropicMessageDelta{StopReason: reason, StopSequence: seq, StopDetails: json.RawMessage("null")}
			if err := send(anthropicEvent{Type: "message_delta", Delta: delta, Usage: &u}); err != nil {
				return err
			}
			return send(anthropicEvent{Type: "message_stop"})
		})
	if err != nil {
		s.log.Debug("anthropic stream ended early", zap.String("route", call.route), zap.Error(err))
	}
}

// anthropicWriter writes a stream's events; the relay and the keep-alive
// pings share it.
type anthropicWriter struct {
	mu    sync.Mutex
	w     *streamWriter
	wrote bool // an event went out since the keep-alive last looked
}

func (a *anthropicWriter) send(ev anthropicEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.wrote = true
	return a.w.write([]byte("event: " + ev.Type + "\ndata: " + string(b) + "\n\n"))
}

// keepAlive sends a ping every period in which nothing else was sent,
// until the returned stop is called (it waits for the pinger to end). A
// ping that cannot be written (the client left) calls gone.
func (a *anthropicWriter) keepAlive(period time.Duration, gone func()) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			a.mu.Lock()
			idle := !a.wrote
			a.wrote = false
			a.mu.Unlock()
			if idle && a.send(anthropicEvent{Type: "ping"}) != nil {
				gone()
				return
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}
