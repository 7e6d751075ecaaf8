package anthropic

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// A streamed Messages reply, as Anthropic's server-sent events:
//
//	message_start          the message, content empty, usage so far (the prompt's tokens)
//	ping
//	content_block_start    a thinking block at a reasoning model's first thought, a text block at the first text,
//	                       a tool_use block (id, name, input {}) at a tool call
//	content_block_delta    thinking_delta, text_delta, or input_json_delta (pieces of a call's input)
//	content_block_stop     before the next block starts, and at the end
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
	ContentBlock *anthropicContent    `json:"content_block,omitempty"`
	Delta        any                  `json:"delta,omitempty"`
	Usage        *anthropicUsage      `json:"usage,omitempty"`
	Error        *anthropicError      `json:"error,omitempty"`
}

type anthropicTextDelta struct {
	Type string `json:"type"` // "text_delta"
	Text string `json:"text"`
}

type anthropicThinkingDelta struct {
	Type     string `json:"type"` // "thinking_delta"
	Thinking string `json:"thinking"`
}

type anthropicJSONDelta struct {
	Type        string `json:"type"` // "input_json_delta"
	PartialJSON string `json:"partial_json"`
}

type anthropicMessageDelta struct {
	StopReason   string          `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	StopDetails  json.RawMessage `json:"stop_details"`
}

// anthropicBlocks writes a stream's content blocks: a piece of thought
// opens a thinking block, a piece of text a text block, a tool call's first
// delta a tool_use block (closing the open block of another kind or call
// first); at most one block is open.
type anthropicBlocks struct {
	send func(anthropicEvent) error
	n    int    // blocks opened so far; the open one is n-1
	open string // "", "thinking", "text" or "tool_use"
	call int    // the open tool_use block's call index
}

func (b *anthropicBlocks) start(cb anthropicContent) error {
	if err := b.close(); err != nil {
		return err
	}
	i := b.n
	b.n++
	b.open = cb.Type
	return b.send(anthropicEvent{Type: "content_block_start", Index: &i, ContentBlock: &cb})
}

func (b *anthropicBlocks) close() error {
	if b.open == "" {
		return nil
	}
	b.open = ""
	i := b.n - 1
	return b.send(anthropicEvent{Type: "content_block_stop", Index: &i})
}

// delta sends a piece of a block of kind (opening one when the open block
// is of another kind).
func (b *anthropicBlocks) delta(kind string, piece string) error {
	if piece == "" {
		return nil
	}
	if b.open != kind {
		cb := anthropicTextBlock("")
		if kind == "thinking" {
			cb = anthropicThinkingBlock("")
		}
		if err := b.start(cb); err != nil {
			return err
		}
	}
	i := b.n - 1
	var d any = anthropicTextDelta{Type: "text_delta", Text: piece}
	if kind == "thinking" {
		d = anthropicThinkingDelta{Type: "thinking_delta", Thinking: piece}
	}
	return b.send(anthropicEvent{Type: "content_block_delta", Index: &i, Delta: d})
}

// tool sends a piece of a tool call: its block's start (id, name, empty
// input) with the call's first delta, its input as input_json_delta.
func (b *anthropicBlocks) tool(d parley.ToolCallDelta) error {
	if b.open != "tool_use" || b.call != d.Index {
		cb := anthropicContent{Type: "tool_use", ID: d.ID, Name: d.Name, Input: json.RawMessage("{}")}
		if err := b.start(cb); err != nil {
			return err
		}
		b.call = d.Index
	}
	if d.Arguments == "" {
		return nil
	}
	i := b.n - 1
	return b.send(anthropicEvent{Type: "content_block_delta", Index: &i, Delta: anthropicJSONDelta{Type: "input_json_delta", PartialJSON: d.Arguments}})
}

// token sends what one token added: thought, then text.
func (b *anthropicBlocks) token(t parley.Token) error {
	if err := b.delta("thinking", t.Reasoning); err != nil {
		return err
	}
	return b.delta("text", t.Text)
}

// streamAnthropic relays call's reply as Anthropic's events.
func (s *API) streamAnthropic(c echo.Context, call *apicore.Call, ac *anthropicCall, id, model string) {
	w := &anthropicWriter{w: s.core.BeginStream(c, "text/event-stream")}
	send := w.send
	defer w.keepAlive(min(anthropicPingEvery, s.core.PingPeriod), call.Cancel)()
	blocks := &anthropicBlocks{send: send}
	call.Tool = blocks.tool
	start := anthropicMessageOut{ID: id, Type: "message", Role: "assistant", Model: model, Content: []anthropicContent{},
		StopDetails: json.RawMessage("null"), Usage: anthropicUsage{InputTokens: call.Rep.PromptTokens()}}
	if err := send(anthropicEvent{Type: "message_start", Message: &start}); err != nil || send(anthropicEvent{Type: "ping"}) != nil {
		call.Cancel()
		call.Collect()
		return
	}
	err := call.Relay(
		func(t parley.Token, _ int) error { return blocks.token(t) },
		func(last *parley.Token, ev parley.Event) error {
			if last != nil {
				if err := blocks.token(*last); err != nil {
					return err
				}
			}
			if rerr := apicore.ReplyError(ev); rerr != nil {
				e := newAnthropicError(ac.patch.RenameSent(rerr))
				return send(anthropicEvent{Type: "error", Error: &e})
			}
			if err := blocks.close(); err != nil {
				return err
			}
			reason, seq := anthropicStop(ev, call.Rep.StopSequence(), ac.stops, ac.params.MaxTokens)
			u := newAnthropicUsage(ev.Usage)
			delta := anthropicMessageDelta{StopReason: reason, StopSequence: seq, StopDetails: json.RawMessage("null")}
			if err := send(anthropicEvent{Type: "message_delta", Delta: delta, Usage: &u}); err != nil {
				return err
			}
			return send(anthropicEvent{Type: "message_stop"})
		})
	if err != nil {
		s.core.Log.Debug("anthropic stream ended early", zap.String("route", call.Route), zap.Error(err))
	}
}

// anthropicWriter writes a stream's events; the relay and the keep-alive
// pings share it.
type anthropicWriter struct {
	mu    sync.Mutex
	w     *apicore.StreamWriter
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
	return a.w.Write([]byte("event: " + ev.Type + "\ndata: " + string(b) + "\n\n"))
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
