package responses

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/oaiwire"
)

// deltaEvent is response.output_text.delta, the event of every token: a
// struct rather than the other events' map, with its fields in the order
// the map's sorted keys take, so the bytes are the same.
type deltaEvent struct {
	ContentIndex   int         `json:"content_index"`
	Delta          string      `json:"delta"`
	ItemID         string      `json:"item_id"`
	Logprobs       [0]struct{} `json:"logprobs"` // always []
	OutputIndex    int         `json:"output_index"`
	SequenceNumber int         `json:"sequence_number"`
	Type           string      `json:"type"`
}

// eventStream numbers and writes one response's stream events.
type eventStream struct {
	emit func(typ string, b []byte) error
	seq  int // the sequence_number of the next event
}

// put sends one event, v, whose sequence_number is es.seq.
func (es *eventStream) put(typ string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	es.seq++
	return es.emit(typ, b)
}

// send sends an event of type typ with fields (and its type and sequence_number).
func (es *eventStream) send(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = es.seq
	return es.put(typ, fields)
}

// steps sends events one after the other, until one fails.
func steps(fns ...func() error) error {
	for _, fn := range fns {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

// atPart adds the location of an output item's one content part to an event's fields.
func atPart(itemID string, index int, m map[string]any) map[string]any {
	m["item_id"], m["output_index"], m["content_index"] = itemID, index, 0
	return m
}

// streamResponse writes a turn as the Responses API's stream events,
// through emit (server-sent events, or WebSocket messages). A failed write
// cancels the turn (through cancel) and ends the stream.
func (s *API) streamResponse(ctx context.Context, cancel context.CancelFunc, resp *session.Response, pr *parsedResponse, emit func(typ string, b []byte) error) error {
	es := &eventStream{emit: emit}
	meter := s.core.Meter(pr.facts.Model)
	observe := func(ev parley.Event) {
		meter.Observe(ev)
		if ev.Done {
			apicore.ReplyLog(s.core.Log.With(zap.String("route", "responses-stream")), ev)
		}
	}
	drain := func(err error) error {
		cancel()
		for ev := range resp.Events() {
			observe(ev)
		}
		return err
	}
	initial := s.newResponseObject(resp.Record, resp.SessionID(), resp.Stored, resp.Model)
	initial.Status = "in_progress"
	pr.echo(initial, resp.SessionID())
	out := &outputItems{es: es, msg: s.outputItem(resp, session.StatusCompleted, ""), sid: resp.SessionID(), end: resp.Record.End}
	err := steps(
		func() error { return es.send("response.created", map[string]any{"response": initial}) },
		func() error { return es.send("response.in_progress", map[string]any{"response": initial}) },
	)
	// The message item opens with the answer's first text (outputItems.token):
	// a reply that is only calls has none, as OpenAI's has none, and a client
	// that refers back to every output item (the AI SDK's item_reference
	// inputs) must find each of them in the response.
	if err != nil {
		return drain(err)
	}
	var final parley.Event
	calls := &callStream{es: es, sid: resp.SessionID(), abs: resp.Record.End - 1}
	for ev := range resp.Events() {
		observe(ev)
		if ev.Done {
			final = ev
			continue
		}
		if ev.ToolCall != nil {
			// A call's items follow the thought and the message item, when
			// the answer has text.
			if err := out.closeReasoning(); err != nil {
				return drain(err)
			}
			if len(calls.opened) == 0 {
				calls.base = out.msgIndex
				if out.msgOpen {
					calls.base++
				}
			}
			if err := calls.delta(*ev.ToolCall); err != nil {
				return drain(err)
			}
		}
		if err := out.token(ev.Token); err != nil {
			return drain(err)
		}
	}
	if final.Finish == parley.FinishError || (final.Finish == parley.FinishCancelled && ctx.Err() == nil) {
		return s.streamFailed(es, resp, pr.renameSent(apicore.ReplyError(final)))
	}
	if err := out.closeReasoning(); err != nil {
		return err
	}
	if len(calls.opened) == 0 {
		if err := out.openMessage(); err != nil { // an empty reply is still a message
			return err
		}
	}
	return s.streamDone(es, resp, pr, out, calls)
}

// streamFailed ends the stream of a turn that failed with err: an error
// event, then response.failed.
func (s *API) streamFailed(es *eventStream, resp *session.Response, err error) error {
	failed := s.newResponseObject(resp.Final(), resp.SessionID(), resp.Stored, resp.Model)
	failed.Status = session.StatusFailed
	failed.Error = &responseError{Code: responseErrorCode(err), Message: parley.ErrorMessage(err)}
	oe := oaiwire.NewError(err)
	ev := map[string]any{"code": oe.Code, "message": oe.Message, "param": oe.Param}
	if d := apicore.RetryAfterSeconds(err); d > 0 {
		// A new session the store refused when the turn was committed
		// (the client's cap, a full store): when to try again.
		ev["status"], ev["retry_after"] = apicore.ErrorStatus(err), d
	}
	if e := es.send("error", ev); e != nil {
		return e
	}
	return es.send("response.failed", map[string]any{"response": failed})
}

// streamDone ends the stream of a turn that finished: the text, the
// content part and the output item done, then response.completed (or
// response.incomplete).
func (s *API) streamDone(es *eventStream, resp *session.Response, pr *parsedResponse, items *outputItems, calls *callStream) error {
	done := s.finishedResponse(resp, pr)
	text := resp.Text()
	part := newPart("output_text", text)
	itemID, index := items.msg.ID, items.msgIndex
	finishCalls := func() error { return calls.done(messageItems(done.Output[calls.base:])) }
	completed := func() error {
		typ := "response.completed"
		if done.Status == session.StatusIncomplete {
			typ = "response.incomplete"
		}
		return es.send(typ, map[string]any{"response": done})
	}
	if !items.msgOpen {
		return steps(finishCalls, completed) // only calls: no message item
	}
	if m, ok := itemAt(done.Output, index); !ok || m.Type != "message" {
		// The message opened on text the reply's end left out (an answer
		// of white space before a call): the response keeps it where it was.
		msg := replyItem(resp.SessionID(), resp.Record.End, done.Status, parley.Message{Role: parley.RoleAssistant})
		done.Output = slices.Insert(done.Output, index, any(msg))
	}
	out := done.Output[index]
	return steps(
		func() error {
			return es.send("response.output_text.done", atPart(itemID, index, map[string]any{"text": text, "logprobs": []any{}}))
		},
		func() error {
			return es.send("response.content_part.done", atPart(itemID, index, map[string]any{"part": part}))
		},
		func() error {
			return es.send("response.output_item.done", map[string]any{"output_index": index, "item": out})
		},
		finishCalls,
		completed,
	)
}

// itemAt is output item i when it is a message or function call item.
func itemAt(out []any, i int) (messageItem, bool) {
	if i >= len(out) {
		return messageItem{}, false
	}
	m, ok := out[i].(messageItem)
	return m, ok
}

// messageItems are the message and function call items of out.
func messageItems(out []any) []messageItem {
	var items []messageItem
	for _, it := range out {
		if m, ok := it.(messageItem); ok {
			items = append(items, m)
		}
	}
	return items
}

// callStream sends a response's function calls as they stream: each call is
// an output item (after the message item, at output index base + its index)
// added with its call_id and name, then its arguments as
// response.function_call_arguments.delta events.
type callStream struct {
	es     *eventStream
	base   int // the output index of call 0: after the message item
	sid    string
	abs    int            // the reply's absolute position: its items' ids
	opened []messageItem  // the calls' items, in progress, by index
	args   map[int]string // the arguments streamed so far, by index
}

func (cs *callStream) delta(d parley.ToolCallDelta) error {
	if d.ID != "" {
		it := functionCallItem(cs.sid, cs.abs, d.Index, parley.ToolCall{ID: d.ID, Name: d.Name}, "in_progress")
		cs.opened = append(cs.opened, it)
		if cs.args == nil {
			cs.args = map[int]string{}
		}
		if err := cs.es.send("response.output_item.added", map[string]any{"output_index": cs.base + d.Index, "item": it}); err != nil {
			return err
		}
	}
	if d.Arguments == "" || d.Index >= len(cs.opened) {
		return nil
	}
	cs.args[d.Index] += d.Arguments
	return cs.es.send("response.function_call_arguments.delta", map[string]any{
		"item_id": cs.opened[d.Index].ID, "output_index": cs.base + d.Index, "delta": d.Arguments})
}

// done ends every call the stream opened: its arguments done, then its item
// (from items, the response's function_call items; a call cut short by the
// reply's end is incomplete).
func (cs *callStream) done(items []messageItem) error {
	for i, it := range cs.opened {
		args := cs.args[i]
		final := it
		final.Status, final.tool.Arguments = "incomplete", args
		for _, done := range items {
			if done.ID == it.ID {
				final, args = done, done.tool.Arguments
			}
		}
		err := steps(
			func() error {
				return cs.es.send("response.function_call_arguments.done", map[string]any{
					"item_id": it.ID, "output_index": cs.base + i, "name": it.tool.Name, "arguments": args})
			},
			func() error {
				return cs.es.send("response.output_item.done", map[string]any{"output_index": cs.base + i, "item": final})
			},
		)
		if err != nil {
			return err
		}
	}
	return nil
}

// responseErrorCode is the code of a failed Responses object's error
// (OpenAI's ResponseError.code names a few kinds, not HTTP-level ones).
func responseErrorCode(err error) string {
	switch parley.ErrorCode(err) {
	case parley.EInvalid, parley.ETooLarge:
		return "invalid_prompt"
	case parley.ERateLimited:
		return "rate_limit_exceeded"
	}
	return "server_error"
}
