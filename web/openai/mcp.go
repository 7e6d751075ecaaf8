package openai

// Tools that run on the server, on chat completions: a request enables the
// operator's MCP servers with {"type": "mcp", "server_label": "math"} entries
// in its tools (allowed_tools narrows a server's tools; "server_label": "*"
// enables every server the user may use), beside its own function tools.
// When the model calls a server tool Parley calls it, feeds the result back
// and asks the model again (toolloop, up to its step limit); calls to the
// client's functions end the reply as they always do.
//
// The client sees every server call and result. Streamed: a chunk whose
// delta is the assistant's call (tool_calls with the call's id, name and
// arguments), then a chunk whose delta has role "tool", the call's
// tool_call_id and the result as content; then the model's next text. Not
// streamed: the choice's server_messages list the same as messages (the
// assistant's calls, then a tool message per result), in order, before the
// choice's message, which is the model's last reply. A client that keeps
// its history appends server_messages and then message.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/oaiwire"
	"github.com/parley-chat/parley/web/internal/servertools"
)

// serverMessage is a message the server added: an assistant's server call
// or a tool's result. A streamed chunk's delta shows it with the same
// fields; content is null beside tool_calls, as OpenAI's own chunks have it.
type serverMessage struct {
	Role       string           `json:"role"`
	Content    *string          `json:"content"`
	ToolCalls  []openAIToolCall `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
}

// serverChoice is a choice with the messages the server added before it.
type serverChoice struct {
	chatChoice
	ServerMessages []serverMessage `json:"server_messages"`
}

type serverChunkChoice struct {
	Index        int           `json:"index"`
	Delta        serverMessage `json:"delta"`
	Logprobs     *struct{}     `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// serverMessages are msgs (what the run added before its final reply) on
// the wire: assistant turns with their calls (text, when one had any) and
// tool messages.
func serverMessages(msgs []parley.Message) []serverMessage {
	out := []serverMessage{}
	for _, m := range msgs {
		text := m.Content
		sm := serverMessage{Role: string(m.Role), Content: &text, ToolCallID: m.ToolCallID}
		if len(m.ToolCalls) > 0 {
			sm.ToolCalls = openAIToolCalls(m.ToolCalls)
			if text == "" {
				sm.Content = nil
			}
		}
		out = append(out, sm)
	}
	return out
}

// chatWithServerTools answers a chat completion that enables server tools.
func (s *API) chatWithServerTools(c echo.Context, cc *chatCall, route string) error {
	if err := s.core.Available(); err != nil {
		return err
	}
	if cc.logprobs {
		return parley.FieldErrorf("logprobs", "is not supported with tools that run on the server")
	}
	rctx := c.Request().Context()
	// Only the messages are counted here, as a rule (see
	// apicore.CountedText): each
	// step's responder holds its rendered prompt to the cap
	// (parley.ReplyRequest.MaxPromptTokens below) as it tokenizes it, so the
	// conversation is tokenized once a step.
	if err := s.core.CountPromptTokens(rctx, cc.facts.Model, apicore.CountedText(cc.msgs, cc.params.Tools, s.core.MaxPromptTokens), len(cc.msgs), true); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(rctx)
	defer cancel()
	tools, err := servertools.Build(ctx, s.core, cc.facts.Caller.User, *cc.server, cc.params.Tools)
	if err != nil {
		return err
	}
	req := parley.ReplyRequest{Key: apicore.ConversationKey(cc.msgs), Model: cc.facts.Model, Client: cc.facts.Caller.Client, User: cc.facts.Caller.User, Scope: cc.facts.Scope, Stateless: true, Messages: cc.msgs, Params: cc.params}
	if s.core.MaxPromptTokens > 0 && s.core.Tokenizer != nil {
		req.MaxPromptTokens = s.core.MaxPromptTokens
	}
	rep, err := tools.Run(ctx, req)
	if err != nil {
		return cc.renameSent(err)
	}
	meter := s.core.Meter(cc.facts.Model)
	log := s.core.Log.With(zap.String("route", route))
	id, created, model := completionID(), time.Now().Unix(), s.core.ModelName(cc.facts.Model)
	if !cc.stream {
		var final parley.Event
		for ev := range rep.Events() {
			meter.Observe(ev)
			if ev.Done {
				final = ev
			}
		}
		apicore.ReplyLog(log, final)
		if rerr := apicore.ReplyError(final); rerr != nil {
			return cc.renameSent(rerr)
		}
		text := rep.Text()
		choice := serverChoice{chatChoice: chatChoice{
			Message:      chatMessageOut{Role: "assistant", Content: &text, ReasoningContent: rep.Reasoning()},
			FinishReason: openAIFinish(final.Finish),
		}, ServerMessages: serverMessages(rep.Steps())}
		if len(final.ToolCalls) > 0 {
			choice.Message.ToolCalls = openAIToolCalls(final.ToolCalls)
			if text == "" {
				choice.Message.Content = nil
			}
		}
		timings := apicore.NewTimings(final.Timings, final.Usage.CompletionTokens)
		return c.JSON(http.StatusOK, struct {
			chatCompletion
			Choices []serverChoice `json:"choices"`
		}{chatCompletion{ID: id, Object: "chat.completion", Created: created, Model: model, SystemFingerprint: systemFingerprint,
			Usage: newOpenAIUsage(final.Usage), Timings: &timings}, []serverChoice{choice}})
	}

	w := s.core.BeginStream(c, "text/event-stream")
	send := func(choices any) error {
		ch := struct {
			chatChunk
			Choices any `json:"choices"`
		}{chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model, SystemFingerprint: systemFingerprint}, choices}
		if cc.includeUsage {
			ch.Usage = json.RawMessage("null")
		}
		b, err := json.Marshal(ch)
		if err != nil {
			return fmt.Errorf("encode chunk: %w", err)
		}
		return w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
	}
	delta := func(d chunkDelta) error { return send([]chunkChoice{{Delta: d}}) }
	server := func(d serverMessage) error { return send([]serverChunkChoice{{Delta: d}}) }
	empty := ""
	err = delta(chunkDelta{Role: "assistant", Content: &empty})
	var final parley.Event
	idx := callIndex{}
	for ev := range rep.Events() {
		meter.Observe(ev)
		if ev.Done {
			final = ev
			continue
		}
		if err != nil {
			continue // the client left: the run ends with ctx (cancelled below), drain it
		}
		err = serverToolEvent(ev, idx, delta, server)
		if err != nil {
			cancel()
		}
	}
	apicore.ReplyLog(log, final)
	if err != nil {
		log.Debug("openai stream ended early", zap.Error(err))
		return nil
	}
	if rerr := apicore.ReplyError(final); rerr != nil {
		b, _ := json.Marshal(oaiwire.ErrorBody{Error: oaiwire.NewError(rerr)})
		return w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
	}
	finish := openAIFinish(final.Finish)
	timings := apicore.NewTimings(final.Timings, final.Usage.CompletionTokens)
	last := chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model, SystemFingerprint: systemFingerprint,
		Choices: []chunkChoice{{Delta: chunkDelta{}, FinishReason: &finish}}, Timings: &timings}
	if cc.includeUsage {
		last.Usage = json.RawMessage("null")
	}
	if err := send(last.Choices); err != nil {
		return nil
	}
	if cc.includeUsage {
		u, err := json.Marshal(newOpenAIUsage(final.Usage))
		if err != nil {
			return fmt.Errorf("encode usage: %w", err)
		}
		uc := chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model, SystemFingerprint: systemFingerprint,
			Choices: []chunkChoice{}, Usage: u}
		b, _ := json.Marshal(uc)
		if err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return nil
		}
	}
	return w.Write([]byte("data: [DONE]\n\n"))
}

// callIndex numbers a run's server calls as OpenAI numbers the tool_calls
// of one assistant message: a call's index is its position among the calls
// of the model reply that made it (the client's calls of that reply, whose
// deltas carry their own index, share the numbering).
type callIndex map[string]int

// step starts a model reply's numbering: its calls, in order.
func (ci callIndex) step(calls []parley.ToolCall) {
	clear(ci)
	for i, c := range calls {
		ci[c.ID] = i
	}
}

// of is call id's index; a call its reply did not list (none is) takes
// the next free one.
func (ci callIndex) of(id string) int {
	i, ok := ci[id]
	if !ok {
		i = len(ci)
		ci[id] = i
	}
	return i
}

// serverToolEvent streams one event of a run: model text and thought, the
// client's call deltas, a server call (as the assistant's tool_calls, at
// its index in its reply, idx) and its result (as a tool message).
func serverToolEvent(ev parley.Event, idx callIndex, delta func(chunkDelta) error, server func(serverMessage) error) error {
	le, _ := servertools.Aside(ev)
	if le != nil {
		switch le.Kind {
		case toolloop.EventReplyDone:
			idx.step(le.Model.ToolCalls)
			return nil
		case toolloop.EventCall:
			c := le.Call
			i := idx.of(c.ID)
			return server(serverMessage{Role: "assistant", ToolCalls: []openAIToolCall{{Index: &i, ID: c.ID, Type: "function",
				Function: openAIFunctionCall{Name: c.Tool.Name, Arguments: c.Arguments}}}})
		case toolloop.EventResult:
			out := le.Call.Output
			return server(serverMessage{Role: "tool", ToolCallID: le.Call.ID, Content: &out})
		case toolloop.EventToken:
			if le.Server {
				return nil
			}
		default:
			return nil
		}
	}
	if r := ev.Token.Reasoning; r != "" {
		if err := delta(chunkDelta{ReasoningContent: &r}); err != nil {
			return err
		}
	}
	if ev.ToolCall != nil {
		if err := delta(chunkDelta{ToolCalls: openAIToolDelta(*ev.ToolCall)}); err != nil {
			return err
		}
	}
	if t := ev.Token.Text; t != "" {
		return delta(chunkDelta{Content: &t})
	}
	return nil
}
