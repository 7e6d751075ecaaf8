// Package servertools runs a reply with the tools that run on the server
// (toolloop over the operator's MCP servers) for any API family: a Responder
// whose Reply is the whole loop, its model tokens, server calls and results
// delivered in order as parley events, and its added messages (the calls
// and their results) handed to the session layer to commit (session.StepsReply).
//
// A family reads the loop's own events from parley.Event.Aside (*toolloop.Event):
// a server call's start and result, an approval request, and each model
// reply's end. Token events of the model keep their Token and carry the loop
// event beside it; a server tool's call deltas carry only the loop event, so
// a family that shows the client's calls never mistakes them for its own.
package servertools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// eventBuffer is the capacity of a Reply's event channel (the loop's own
// channel buffers as much again).
const eventBuffer = 64

// Responder replies with a request's server tools: every Reply is one run
// of the tool loop over the model behind r.
type Responder struct {
	r     parley.Responder
	host  toolloop.Host
	tools *toolloop.Toolset
	log   *zap.Logger
	// MaxSteps bounds the model replies of a run (0: toolloop's default).
	MaxSteps int
}

// NewResponder returns a Responder that runs tools (built for the request's
// user with toolloop.Build) through host, asking the model through r.
func NewResponder(r parley.Responder, host toolloop.Host, tools *toolloop.Toolset, log *zap.Logger) *Responder {
	if log == nil {
		log = zap.NewNop()
	}
	return &Responder{r: r, host: host, tools: tools, log: log}
}

// Tools is the request's toolset.
func (lr *Responder) Tools() *toolloop.Toolset { return lr.tools }

// Host is what the tools are called through.
func (lr *Responder) Host() toolloop.Host { return lr.host }

// Log is the logger of the tool calls.
func (lr *Responder) Log() *zap.Logger { return lr.log }

var _ parley.Responder = (*Responder)(nil)

// Reply starts a run on req.Messages with req.Params (the client's
// parameters and tools): every model reply of the run is asked for with
// req's key, model and keep-alive, so it shares the conversation's KV
// cache. A refusal of the request or of its first reply returns here.
func (lr *Responder) Reply(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	rep, err := lr.run(ctx, req)
	if err != nil {
		return nil, err // never a nil *Reply in the interface
	}
	return rep, nil
}

// Complete carries on a raw prompt as the model behind lr does: a raw
// prompt has no tool calls for the loop to run.
func (lr *Responder) Complete(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	return lr.r.Complete(ctx, req)
}

// Run is Reply with the run's own reply type (its Steps and Outcome).
func (lr *Responder) Run(ctx context.Context, req parley.ReplyRequest) (*Reply, error) {
	return lr.run(ctx, req)
}

func (lr *Responder) run(ctx context.Context, req parley.ReplyRequest) (*Reply, error) {
	rep := &Reply{events: make(chan parley.Event, eventBuffer), ended: make(chan struct{})}
	loop := toolloop.New(func(ctx context.Context, msgs []parley.Message, p parley.Params) (toolloop.Reply, error) {
		step := req
		step.Messages, step.Params = msgs, p
		r, err := lr.r.Reply(ctx, step)
		if err != nil {
			return nil, err
		}
		rep.step.Store(&stepReply{r})
		return r, nil
	}, lr.host, toolloop.WithLogger(lr.log))
	run, err := loop.Start(ctx, toolloop.Request{Messages: req.Messages, Params: req.Params, Tools: lr.tools, MaxSteps: lr.MaxSteps})
	if err != nil {
		return nil, err
	}
	go rep.pump(ctx, run)
	return rep, nil
}

// stepReply holds the model reply of a run's latest step.
type stepReply struct{ parley.Reply }

// Reply is one run of the loop as a model reply (session.StepsReply): Text
// and Reasoning are its last assistant message's, Steps the messages before it.
type Reply struct {
	events chan parley.Event
	// set before the final event is sent, read after it
	done  *toolloop.Done
	steps []parley.Message
	last  parley.Message
	ended chan struct{} // closed once the run has ended (its last model reply included)
	// step is the model reply of the run's latest step (nil before the
	// first): the loop's goroutine stores it as each step starts, and the
	// prompt methods read it from any goroutine.
	step atomic.Pointer[stepReply]
}

// Events yields the run's events: tokens and Aside events, then exactly one
// final event (Done set), then it is closed.
func (r *Reply) Events() <-chan parley.Event { return r.events }

// Text is the final reply's text; valid after the final event.
func (r *Reply) Text() string { return r.last.Content }

// Reasoning is the final reply's thought; valid after the final event.
func (r *Reply) Reasoning() string { return r.last.Reasoning }

// Prompt is the rendered prompt of the run's latest step (a run renders
// one prompt per step, each the one before with the step's calls and
// results added): the first step's until the next starts, the last step's
// once the final event has been read. "" for a run that started with
// pending calls and has not asked the model yet.
func (r *Reply) Prompt() string {
	if s := r.step.Load(); s != nil {
		return s.Prompt()
	}
	return ""
}

// PromptTokens is the tokens of the latest step's prompt (see Prompt): the
// size of the prompt the run's final reply answered, once the final event
// has been read. The final event's usage sums the prompts of every step.
func (r *Reply) PromptTokens() int {
	if s := r.step.Load(); s != nil {
		return s.PromptTokens()
	}
	return 0
}

// Dropped is how many of the oldest messages the latest step's prompt left
// out to fit the context (see Prompt).
func (r *Reply) Dropped() int {
	if s := r.step.Load(); s != nil {
		return s.Dropped()
	}
	return 0
}

// StopSequence is the final reply's stop string; a run ends on its
// model's end of turn or a tool call, so it is "".
func (r *Reply) StopSequence() string { return "" }

// Steps are the messages the run added before its final reply; valid after
// the final event.
func (r *Reply) Steps() []parley.Message { return r.steps }

// Outcome is how the run ended; valid after the final event.
func (r *Reply) Outcome() *toolloop.Done { return r.done }

// Done is closed once the run has ended: its final event is in Events and
// its last model reply has ended.
func (r *Reply) Done() <-chan struct{} { return r.ended }

// pump turns the run's events into parley events until the run ends. The
// run stops on its own once ctx ends, so pump always ends.
func (r *Reply) pump(ctx context.Context, run *toolloop.Run) {
	defer close(r.ended)
	defer close(r.events)
	for ev := range run.Events() {
		if ev.Kind == toolloop.EventDone {
			r.finish(ev.Done)
			final := ev.Done.Final
			final.Done = true
			if final.Finish == parley.FinishToolCalls || final.Finish == toolloop.FinishApproval {
				final.ToolCalls = r.last.ToolCalls
			}
			r.events <- final // the reader takes the final event whatever happened before (the buffer holds it once ctx ended)
			return
		}
		ev := ev
		out := parley.Event{Aside: &ev}
		if ev.Kind == toolloop.EventToken && !ev.Server {
			out.Token, out.ToolCall = ev.Model.Token, ev.Model.ToolCall
		}
		select {
		case r.events <- out:
		case <-ctx.Done():
			// The reader left: drop the event (the run ends within a step).
		}
	}
	// The loop always ends with EventDone; this only guards a broken run.
	r.events <- parley.Event{Done: true, Finish: parley.FinishError, Err: fmt.Errorf("the tool loop ended without a final event")}
}

// finish splits the run's messages into the steps and the final reply. A
// run whose last message is a tool's result (several calls of one reply,
// some made, some waiting) gets an empty final reply after it, so the
// conversation ends with an assistant turn.
func (r *Reply) finish(d *toolloop.Done) {
	r.done = d
	n := len(d.Messages)
	switch {
	case n == 0:
	case d.Messages[n-1].Role == parley.RoleAssistant:
		r.steps, r.last = d.Messages[:n-1], d.Messages[n-1]
	default:
		r.steps, r.last = d.Messages, parley.Message{Role: parley.RoleAssistant}
	}
}

// Aside returns the loop event ev carries, if any.
func Aside(ev parley.Event) (*toolloop.Event, bool) {
	le, ok := ev.Aside.(*toolloop.Event)
	return le, ok
}

// FindCall returns the server call id of the conversation msgs (the latest
// assistant turn that made it) and whether a tool message answers it.
func FindCall(msgs []parley.Message, id string) (call parley.ToolCall, answered, ok bool) {
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == parley.RoleTool && m.ToolCallID == id {
			answered = true
		}
		for _, c := range m.ToolCalls {
			if c.ID == id {
				return c, answered, true
			}
		}
	}
	return parley.ToolCall{}, false, false
}

// Build lists the server tools sel enables for user beside client
// (the request's own tools) and returns the Responder that runs them. A
// server without tools for the user, or a server the user may not use, is
// an EInvalid error naming it (field names the request's field).
func Build(ctx context.Context, core *apicore.Core, user string, sel toolloop.Selection, client []parley.Tool) (*Responder, error) {
	if core.Tools == nil || len(core.Tools.Servers(user)) == 0 {
		if sel.All {
			return nil, parley.Errorf(parley.EInvalid, "no MCP server is configured for you on this server (the operator configures them with --mcp-config)")
		}
	}
	var host toolloop.Host = core.Tools
	if host == nil {
		host = noHost{}
	}
	ts, err := toolloop.Build(ctx, host, user, sel, client)
	if err != nil {
		return nil, err
	}
	return NewResponder(core.Responder, host, ts, core.Log.Named("tools")), nil
}

// noHost is a server without MCP servers: it names none, so every server a
// request names is refused.
type noHost struct{}

func (noHost) Servers(string) []string { return nil }
func (noHost) ListTools(context.Context, string, string) ([]toolloop.RemoteTool, error) {
	return nil, parley.Errorf(parley.ENotFound, "no such MCP server")
}
func (noHost) CallTool(context.Context, string, string, string, json.RawMessage) (toolloop.Result, error) {
	return toolloop.Result{}, parley.Errorf(parley.ENotFound, "no such MCP server")
}

// chatMCPTool is a chat request's {"type": "mcp"} tool: a server the
// operator configured ("*": every server the user may use), and the tools
// of it to offer (all the user may call when absent). Chat APIs have no
// approval round-trip, so require_approval may only be "never".
type chatMCPTool struct {
	Type            string          `json:"type"`
	ServerLabel     string          `json:"server_label"`
	AllowedTools    []string        `json:"allowed_tools"`
	RequireApproval json.RawMessage `json:"require_approval"`
}

// AllServers is the server_label that enables every server the user may use.
const AllServers = "*"

// SplitTools takes a chat request's mcp tools out of its tools (field names
// the array): the rest (the client's function tools, for apicore.ParseTools)
// and the selection of server tools, nil when the request has none.
func SplitTools(raw json.RawMessage, field string) (json.RawMessage, *toolloop.Selection, error) {
	if !apicore.IsSet(raw) {
		return raw, nil, nil
	}
	var entries []json.RawMessage
	if json.Unmarshal(raw, &entries) != nil {
		return raw, nil, nil // ParseTools names the error
	}
	var sel toolloop.Selection
	rest := make([]json.RawMessage, 0, len(entries))
	for i, e := range entries {
		var t chatMCPTool
		if json.Unmarshal(e, &t) != nil || t.Type != "mcp" {
			rest = append(rest, e)
			continue
		}
		f := fmt.Sprintf("%s[%d]", field, i)
		if t.ServerLabel == "" {
			return nil, nil, parley.FieldErrorf(f+".server_label", "is required (a server of --mcp-config, or \"*\" for all you may use)")
		}
		if apicore.IsSet(t.RequireApproval) && string(bytes.TrimSpace(t.RequireApproval)) != `"never"` {
			return nil, nil, parley.FieldErrorf(f+".require_approval", "must be \"never\": this API has no approval round-trip (the Responses API has)")
		}
		if t.ServerLabel == AllServers {
			if len(t.AllowedTools) > 0 {
				return nil, nil, parley.FieldErrorf(f+".allowed_tools", "names tools of one server: give its server_label rather than \"*\"")
			}
			sel.All = true
			continue
		}
		sel.Servers = append(sel.Servers, toolloop.MCPSpec{ServerLabel: t.ServerLabel, AllowedTools: t.AllowedTools,
			RequireApproval: toolloop.Approval{Mode: toolloop.ApprovalNever}})
	}
	if !sel.All && len(sel.Servers) == 0 {
		return raw, nil, nil
	}
	if sel.All && len(sel.Servers) > 0 {
		return nil, nil, parley.FieldErrorf(field, "enables every server (\"*\") and names some too: give one or the other")
	}
	out, err := json.Marshal(rest)
	if err != nil {
		return nil, nil, fmt.Errorf("encode tools: %w", err)
	}
	if len(rest) == 0 {
		out = nil
	}
	return out, &sel, nil
}
