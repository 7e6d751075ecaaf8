package toolloop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// DefaultMaxSteps is how many model replies one run makes at most when the
// request does not say: the last one may not call a server tool, so a model
// that keeps calling tools still ends with an answer.
const DefaultMaxSteps = 8

// MaxSteps bounds Request.MaxSteps.
const MaxSteps = 64

// FinishApproval ends a run that stopped at calls waiting for the user's
// approval (Done.Approvals lists them).
const FinishApproval parley.FinishReason = "approval_required"

// ErrStepLimit is the Err of a run's final event when the model called a
// server tool in its last allowed step.
var ErrStepLimit = errors.New("the model called a server tool after the step limit")

// Declined is the tool message of a call the user did not approve.
const Declined = "The user declined this tool call."

// DeclinedError is a declined call's error, as the user sees it.
const DeclinedError = "the user declined this call"

// eventBuffer is the capacity of a run's event channel: token events of
// one reply are far more numerous, and the run waits for its reader (the
// chat layer's own buffer keeps the engine from waiting in turn).
const eventBuffer = 64

// Reply is one model reply as the chat layer streams it (*chat.Reply has
// this method): token events, then exactly one event with Done set, then
// the channel is closed.
type Reply interface {
	Events() <-chan parley.Event
}

// ReplyFunc starts the model's reply to msgs with p. A closure over
// chat.Responder.Reply and the request's KV-cache key fits.
type ReplyFunc func(ctx context.Context, msgs []parley.Message, p parley.Params) (Reply, error)

// Request is one run: a conversation, the client's parameters, and the
// server tools it enables.
type Request struct {
	// Messages is the conversation, ending with the user's message, or with
	// an assistant turn whose server calls wait for an approval (resumed
	// with Approvals) or for their results.
	Messages []parley.Message
	// Params are the client's parameters; its Tools are the client's own.
	Params parley.Params
	// Tools are the server tools enabled (Build).
	Tools *Toolset
	// Approvals are the user's decisions on earlier ApprovalRequests, by ID:
	// true approves the call.
	Approvals map[string]bool
	// MaxSteps bounds the model replies of the run (0: DefaultMaxSteps).
	MaxSteps int
}

// EventKind says what an Event reports.
type EventKind int

// Event kinds, in the order a step emits them.
const (
	// EventToken is a token of a model reply (Model: a parley token event).
	// Server marks a tool-call delta that belongs to a server tool.
	EventToken EventKind = iota + 1
	// EventReplyDone ends one model reply (Model: its final event).
	EventReplyDone
	// EventCall starts a server tool call (Call without output).
	EventCall
	// EventResult is the call's result (Call with Output or Error).
	EventResult
	// EventApproval asks the user to approve a call (Approval); the run
	// then ends with FinishApproval.
	EventApproval
	// EventDone ends the run (Done); the channel is closed after it.
	EventDone
)

// Event is one step of a run. Exactly one EventDone ends every run.
type Event struct {
	Kind     EventKind
	Step     int          // the model reply it belongs to, from 1
	Model    parley.Event // EventToken, EventReplyDone
	Server   bool         // EventToken: Model.ToolCall is a server tool's
	Call     *Call        // EventCall, EventResult
	Approval *ApprovalRequest
	Done     *Done
}

// Call is one server tool call.
type Call struct {
	ID        string // the tool call's ID, as the model's reply gave it
	Tool      Tool
	Arguments string // JSON text, as generated
	Output    string // what the model reads as the result (EventResult)
	Error     string // why the call failed or what error the tool reported; "" when it succeeded
}

// ApprovalRequest asks the user whether a server tool call may go ahead.
// ID answers it in Request.Approvals; it is the tool call's ID.
type ApprovalRequest struct {
	ID        string
	Tool      Tool
	Arguments string
}

// Done is how a run ended.
type Done struct {
	// Final is the run's final event: the last reply's finish reason,
	// FinishToolCalls when client tool calls wait for the client
	// (ClientCalls), FinishApproval when calls wait for approval; Usage sums
	// every reply of the run; Err is set with FinishError.
	Final parley.Event
	// Messages are what the run appended to Request.Messages, in order:
	// each assistant turn (its tool calls included), each server tool's
	// result as a RoleTool message, and the final reply. Committing them
	// keeps the conversation whole for the next run.
	Messages []parley.Message
	// ClientCalls are the calls to the client's tools of the last reply:
	// the client runs them and sends their results.
	ClientCalls []parley.ToolCall
	// Approvals are the calls waiting for the user's approval.
	Approvals []ApprovalRequest
	// Steps counts the model replies the run made.
	Steps int
}

// Loop runs requests against one model and one Host. It is safe for
// concurrent use: every run is independent.
type Loop struct {
	reply ReplyFunc
	host  Host
	log   *zap.Logger
}

// Option configures a Loop.
type Option func(*Loop)

// WithLogger sets the logger; the default discards.
func WithLogger(l *zap.Logger) Option { return func(lp *Loop) { lp.log = l } }

// New returns a Loop that asks the model through reply and calls server
// tools through host.
func New(reply ReplyFunc, host Host, opts ...Option) *Loop {
	l := &Loop{reply: reply, host: host, log: zap.NewNop()}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Run is one run in progress. Its reader must read Events until it is
// closed or cancel the context the run started with.
type Run struct {
	events chan Event
}

// Events returns the run's events; EventDone is the last.
func (r *Run) Events() <-chan Event { return r.events }

// Start checks req and starts the run. Errors in the request (its
// parameters with the server tools, a step limit out of range) and the
// first reply's refusal, when the run starts with a reply, return here
// before any event, so a wire layer can answer them with a status.
func (l *Loop) Start(ctx context.Context, req Request) (*Run, error) {
	if req.Tools == nil {
		req.Tools = &Toolset{byName: map[string]Tool{}, byCall: map[[2]string]Tool{}, client: req.Params.Tools}
	}
	switch {
	case req.MaxSteps == 0:
		req.MaxSteps = DefaultMaxSteps
	case req.MaxSteps < 1 || req.MaxSteps > MaxSteps:
		return nil, parley.FieldErrorf("max_tool_steps", "must be between 1 and %d, got %d", MaxSteps, req.MaxSteps)
	}
	if len(req.Messages) == 0 {
		return nil, parley.FieldErrorf("messages", "at least one message is needed")
	}
	s := &state{
		l: l, req: req, msgs: append([]parley.Message(nil), req.Messages...),
		run: &Run{events: make(chan Event, eventBuffer)}, ctx: ctx,
	}
	var err error
	if s.full, err = req.Tools.Params(req.Params); err != nil {
		return nil, err
	}
	if s.last, err = req.Tools.clientParams(req.Params); err != nil {
		return nil, err
	}
	s.pending = pendingCalls(req.Messages, req.Tools)
	var first Reply
	if len(s.pending) == 0 {
		// Start the first reply here, so its refusal is this call's error.
		if first, err = s.startReply(1); err != nil {
			return nil, err
		}
	}
	go s.loop(first)
	return s.run, nil
}

// pendingCalls returns the server calls of the conversation's last
// assistant turn that no tool message after it answers.
func pendingCalls(msgs []parley.Message, ts *Toolset) []parley.ToolCall {
	last := -1
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == parley.RoleAssistant {
			last = i
			break
		}
		if msgs[i].Role != parley.RoleTool {
			return nil // a user's message after it: nothing waits
		}
	}
	if last < 0 {
		return nil
	}
	answered := map[string]bool{}
	for _, m := range msgs[last+1:] {
		answered[m.ToolCallID] = true
	}
	var out []parley.ToolCall
	for _, c := range msgs[last].ToolCalls {
		if _, ok := ts.Lookup(c.Name); ok && !answered[c.ID] {
			out = append(out, c)
		}
	}
	return out
}

// state is one run's, owned by its goroutine.
type state struct {
	l       *Loop
	req     Request
	ctx     context.Context
	run     *Run
	full    parley.Params     // the client's params with the server tools
	last    parley.Params     // the client's tools only: the last step's
	free    *parley.Params    // full with ToolAuto: the later steps' of a forced call; made by the first of them
	msgs    []parley.Message  // the conversation so far
	added   []parley.Message  // what the run appended
	pending []parley.ToolCall // server calls of the last assistant turn yet to make
	usage   parley.Usage
	steps   int
}

// startReply starts the model's reply for step.
func (s *state) startReply(step int) (Reply, error) {
	p := s.full
	if step > 1 && p.ToolsForced() {
		// A forced call is the first reply's: later ones choose freely. The
		// choice changes on params validated at Start, so only the call
		// grammar follows it (once a run); they are not validated again.
		if s.free == nil {
			free := s.full
			if err := free.SetToolChoice(parley.ToolChoice{Mode: parley.ToolAuto}); err != nil {
				return nil, err
			}
			s.free = &free
		}
		p = *s.free
	}
	if step >= s.req.MaxSteps {
		p = s.last
	}
	return s.l.reply(s.ctx, s.msgs, p)
}

// emit sends ev unless the reader has gone (ctx ended).
func (s *state) emit(ev Event) bool {
	select {
	case s.run.events <- ev:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// loop is the run's goroutine: steps until the model answers, client calls
// or approvals wait, the step limit is reached, or ctx ends.
func (s *state) loop(first Reply) {
	defer close(s.run.events)
	done := s.step(first)
	done.Messages, done.Steps = s.added, s.steps
	done.Final.Done = true
	done.Final.Usage = s.usage
	ev := Event{Kind: EventDone, Step: s.steps, Done: done}
	select {
	case s.run.events <- ev:
	default:
		s.emit(ev)
	}
}

// step runs the steps of the loop and returns how the run ended.
func (s *state) step(rep Reply) *Done {
	if len(s.pending) > 0 {
		if d := s.callPending(nil); d != nil {
			return d
		}
	}
	for {
		s.steps++
		if rep == nil {
			var err error
			if rep, err = s.startReply(s.steps); err != nil {
				return errorDone(fmt.Errorf("step %d: %w", s.steps, err))
			}
		}
		final, text, reasoning, ok := s.stream(rep)
		rep = nil
		if !ok {
			return &Done{Final: parley.Event{Finish: parley.FinishCancelled, Err: context.Cause(s.ctx)}}
		}
		msg := parley.Message{Role: parley.RoleAssistant, Content: text, Reasoning: reasoning, ToolCalls: s.marked(final.ToolCalls),
			Interrupted: final.Finish == parley.FinishCancelled}
		s.add(msg)
		if final.Finish != parley.FinishToolCalls || len(final.ToolCalls) == 0 {
			return &Done{Final: final}
		}
		var client []parley.ToolCall
		s.pending = nil
		for _, c := range final.ToolCalls {
			if _, ok := s.req.Tools.Lookup(c.Name); ok {
				s.pending = append(s.pending, c)
			} else {
				client = append(client, c)
			}
		}
		if len(s.pending) > 0 && s.steps >= s.req.MaxSteps {
			// The last step offers no server tool; a call to one anyway (a
			// reply the grammar did not constrain) is not made.
			return &Done{Final: parley.Event{Finish: parley.FinishLength, Err: ErrStepLimit}, ClientCalls: client}
		}
		if d := s.callPending(client); d != nil {
			return d
		}
		if len(client) > 0 {
			return &Done{Final: parley.Event{Finish: parley.FinishToolCalls, ToolCalls: client}, ClientCalls: client}
		}
	}
}

// stream forwards one reply's events and returns its final event with the
// text and thought it delivered; ok is false when the reader went away.
func (s *state) stream(rep Reply) (final parley.Event, text, reasoning string, ok bool) {
	var tb, rb strings.Builder
	server := map[int]bool{} // tool-call index -> a server tool's
	gone := false
	for ev := range rep.Events() {
		if ev.Done {
			final = ev
			continue
		}
		tb.WriteString(ev.Token.Text)
		rb.WriteString(ev.Token.Reasoning)
		isServer := false
		if c := ev.ToolCall; c != nil {
			if c.Name != "" {
				_, server[c.Index] = s.req.Tools.Lookup(c.Name)
			}
			isServer = server[c.Index]
		}
		if !gone && !s.emit(Event{Kind: EventToken, Step: s.steps, Model: ev, Server: isServer}) {
			gone = true // drain the reply: it ends within a step once ctx has
		}
	}
	if !final.Done {
		final = parley.Event{Done: true, Finish: parley.FinishError, Err: errors.New("the reply ended without a final event")}
	}
	s.usage.PromptTokens += final.Usage.PromptTokens
	s.usage.CachedPromptTokens += final.Usage.CachedPromptTokens
	s.usage.CompletionTokens += final.Usage.CompletionTokens
	s.usage.ReasoningTokens += final.Usage.ReasoningTokens
	if gone || !s.emit(Event{Kind: EventReplyDone, Step: s.steps, Model: final}) {
		return final, "", "", false
	}
	return final, tb.String(), rb.String(), true
}

// marked is calls with each server tool's call marked (ToolCall.Server),
// a copy: the final event's calls stay the model's.
func (s *state) marked(calls []parley.ToolCall) []parley.ToolCall {
	if len(calls) == 0 {
		return calls
	}
	out := slices.Clone(calls)
	for i, c := range out {
		if t, ok := s.req.Tools.Lookup(c.Name); ok {
			out[i].Server = &parley.ServerCall{Label: t.Server, Tool: t.Remote, Approval: t.NeedsApproval}
		}
	}
	return out
}

// add appends m to the conversation and to what the run added.
func (s *state) add(m parley.Message) {
	s.msgs = append(s.msgs, m)
	s.added = append(s.added, m)
}

// callPending makes the pending server calls that need no approval or were
// approved, answers declined ones, and returns the run's end when calls
// still wait for approval (after the others are made) or ctx ended; nil to
// go on. client are the reply's client calls, reported with the approvals.
func (s *state) callPending(client []parley.ToolCall) *Done {
	var waiting []ApprovalRequest
	for _, c := range s.pending {
		t, _ := s.req.Tools.Lookup(c.Name)
		if t.NeedsApproval {
			approved, decided := s.req.Approvals[c.ID]
			if !decided {
				waiting = append(waiting, ApprovalRequest{ID: c.ID, Tool: t, Arguments: c.Arguments})
				continue
			}
			if !approved {
				s.add(parley.Message{Role: parley.RoleTool, ToolCallID: c.ID, Name: c.Name, Content: Declined, ToolError: DeclinedError})
				continue
			}
		}
		if !s.call(c, t) {
			return &Done{Final: parley.Event{Finish: parley.FinishCancelled, Err: context.Cause(s.ctx)}}
		}
	}
	s.pending = nil
	if len(waiting) == 0 {
		return nil
	}
	for i := range waiting {
		if !s.emit(Event{Kind: EventApproval, Step: s.steps, Approval: &waiting[i]}) {
			return &Done{Final: parley.Event{Finish: parley.FinishCancelled, Err: context.Cause(s.ctx)}}
		}
	}
	return &Done{Final: parley.Event{Finish: FinishApproval, ToolCalls: client}, Approvals: waiting, ClientCalls: client}
}

// call makes one server call and appends its result; false when ctx ended.
func (s *state) call(c parley.ToolCall, t Tool) bool {
	call := &Call{ID: c.ID, Tool: t, Arguments: c.Arguments}
	if !s.emit(Event{Kind: EventCall, Step: s.steps, Call: call}) {
		return false
	}
	out := Invoke(s.ctx, s.l.host, s.req.Tools.User(), t, c, s.l.log)
	if s.ctx.Err() != nil {
		return false
	}
	s.add(ResultMessage(out))
	return s.emit(Event{Kind: EventResult, Step: s.steps, Call: &out})
}

// Invoke makes one server call outside a run (an approved call that a wire
// layer makes before the run that carries on after it) or inside one: the
// Call with its Output, or its Error when the call failed or the tool
// reported one. log may be nil.
func Invoke(ctx context.Context, host Host, user string, t Tool, c parley.ToolCall, log *zap.Logger) Call {
	out := Call{ID: c.ID, Tool: t, Arguments: c.Arguments}
	args := json.RawMessage(c.Arguments)
	if len(strings.TrimSpace(c.Arguments)) == 0 {
		args = json.RawMessage("{}")
	}
	res, err := host.CallTool(ctx, user, t.Server, t.Remote, args)
	switch {
	case err != nil:
		out.Error = err.Error()
		out.Output = "error: " + out.Error
		if log != nil {
			log.Info("server tool call failed", zap.String("server", t.Server), zap.String("tool", t.Remote), zap.Error(err))
		}
	case res.IsError:
		out.Output, out.Error = res.Content, res.Content
		if out.Error == "" {
			out.Error = "the tool reported an error"
		}
	default:
		out.Output = res.Content
	}
	return out
}

// ResultMessage is c's result as the tool message the model reads.
func ResultMessage(c Call) parley.Message {
	return parley.Message{Role: parley.RoleTool, ToolCallID: c.ID, Name: c.Tool.Name, Content: c.Output, ToolError: c.Error}
}

// errorDone is the end of a run that failed.
func errorDone(err error) *Done {
	return &Done{Final: parley.Event{Finish: parley.FinishError, Err: err}}
}
