package session

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/parley-chat/parley"
)

// Responses and conversations (OpenAI's Responses and Conversations APIs)
// are views of sessions, so a conversation started on a WebSocket can be
// continued over HTTP and back:
//
//   - a conversation is a session; its id is "conv_" + the session id;
//   - a response is one turn of a session, recorded in Session.Responses;
//     its id holds the session id encrypted (ids.go), so the id alone finds
//     the session (no index to keep besides the store) without revealing it;
//   - an item is a message of the session, named by its absolute position
//     (positions count messages dropped by the byte cap, see Session.Trimmed).
//
// A record points at its turn by absolute positions and checks a hash of
// its reply, so a record whose messages were trimmed, reset or edited away
// is reported as gone rather than showing other messages.

// ID prefixes of the Responses and Conversations APIs.
const (
	ResponsePrefix     = "resp_"
	ConversationPrefix = "conv_"
)

// maxResponseRecords bounds Session.Responses; the oldest records go first.
const maxResponseRecords = 1000

// responseSuffixBytes is the random part of a response id of the earlier
// form, after the session id (ids.go).
const responseSuffixBytes = 6

// ResponseRecord is what a session keeps of one response (one turn run
// through the Responses API): where its messages are and what it cost.
type ResponseRecord struct {
	ID    string `json:"id"`
	Start int    `json:"start"` // absolute position of its first input message
	End   int    `json:"end"`   // absolute position just past its reply
	Hash  uint64 `json:"hash"`  // FNV-1a of the reply's text
	// Steps counts the messages tools run on the server added between the
	// input and the reply (StepsReply): the input ends at End-1-Steps.
	Steps int `json:"steps,omitempty"`
	// Listed is what the wire layer showed of the turn before its steps
	// and keeps to show it again (the Responses API's mcp_list_tools
	// items), as it encoded them (ResponseRequest.Listed).
	Listed       json.RawMessage `json:"listed,omitempty"`
	Created      int64           `json:"created"`
	Status       string          `json:"status"`           // completed, incomplete, cancelled
	Finish       string          `json:"finish,omitempty"` // the engine's finish reason
	Instructions string          `json:"-"`                // the system prompt it ran with; not stored (the session's System is), filled in by GetResponse
	Previous     string          `json:"previous,omitempty"`
	InputTokens  int             `json:"input_tokens,omitempty"`
	CachedTokens int             `json:"cached_tokens,omitempty"`
	OutputTokens int             `json:"output_tokens,omitempty"`
	// ReasoningTokens are the output tokens of a reasoning model's thought.
	ReasoningTokens int     `json:"reasoning_tokens,omitempty"`
	MaxTokens       int     `json:"max_tokens,omitempty"`
	Temperature     float64 `json:"temperature,omitempty"`
	TopP            float64 `json:"top_p,omitempty"`
}

// Response statuses, as the Responses API spells them.
const (
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusCancelled  = "cancelled"
	StatusFailed     = "failed"
)

func textHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// pos is the index in s.Messages of absolute position abs, or -1 when it is
// not (or no longer) there.
func (s *Session) pos(abs int) int {
	i := abs - s.Trimmed
	if i < 0 || i >= len(s.Messages) {
		return -1
	}
	return i
}

// Record returns the session's record of response id, if it is still whole:
// its messages are all in the history and its reply is the one recorded.
func (s *Session) Record(id string) (ResponseRecord, bool) {
	for i := len(s.Responses) - 1; i >= 0; i-- {
		r := s.Responses[i]
		if r.ID != id {
			continue
		}
		first, last := s.pos(r.Start), s.pos(r.End-1)
		if first < 0 || last < 0 || s.Messages[last].Role != parley.RoleAssistant ||
			textHash(s.Messages[last].Content) != r.Hash {
			return ResponseRecord{}, false
		}
		return r, true
	}
	return ResponseRecord{}, false
}

// Span returns the messages of absolute positions [start, end), which must
// be in the history (see Record).
func (s *Session) Span(start, end int) []parley.Message {
	a, b := s.pos(start), s.pos(end-1)
	if a < 0 || b < a {
		return nil
	}
	return slices.Clone(s.Messages[a : b+1])
}

// Next is the absolute position the next message will have.
func (s *Session) Next() int { return s.Trimmed + len(s.Messages) }

// addItems adds conversation items: a system message replaces the system
// prompt, the others are appended to the history. It returns the appended
// ones.
func (s *Session) addItems(msgs []parley.Message) []parley.Message {
	var added []parley.Message
	for _, m := range msgs {
		if m.Role == parley.RoleSystem {
			s.System = m.Content
			continue
		}
		s.Messages = append(s.Messages, m)
		added = append(added, m)
	}
	return added
}

// pruneRecords drops records that no longer point into the history and
// keeps at most maxResponseRecords.
func (s *Session) pruneRecords() {
	s.Responses = slices.DeleteFunc(s.Responses, func(r ResponseRecord) bool {
		return r.End <= s.Trimmed || r.End > s.Next()
	})
	if n := len(s.Responses) - maxResponseRecords; n > 0 {
		s.Responses = slices.Delete(s.Responses, 0, n)
	}
	if len(s.Responses) == 0 {
		s.Responses = nil
	}
}

// ResponseRequest is one request of the Responses API, decoded by the wire.
type ResponseRequest struct {
	// Previous is the response to continue ("" = none). When it is the
	// newest turn of its session the new turn joins that session (and its
	// KV cache); an older one forks a new session with the history up to it.
	Previous string
	// Conversation is a session id to continue ("" = none; exclusive with Previous).
	Conversation string
	// Input is the new messages; the last one must be a user message.
	// System messages replace the session's system prompt.
	Input []parley.Message
	// Instructions, when set, replaces the session's system prompt.
	Instructions *string
	// NoStore runs the turn on a copy that is never stored: its reply is
	// a stateless request (parley.ReplyRequest.Stateless).
	NoStore bool
	// Local, when set, is where Previous is looked up instead of the store:
	// a session a connection keeps for itself (Response.Local of an earlier
	// NoStore turn), so unstored turns can be chained on one connection.
	// The turn runs on a copy and is not stored (NoStore is implied).
	Local  *Session
	Params parley.Params
	// Listed is kept in the turn's record (ResponseRecord.Listed); the
	// wire layer bounds its size.
	Listed json.RawMessage
	// Model is the model the request names ("" the default): a new
	// session's, and the reply's unless the session holds one of its own.
	Model string
	// Durable stores the turn before its reply starts, marked interrupted
	// (see Turn.durable), so a response that a crash cuts short is still
	// there, incomplete, after a restart. A background response is.
	Durable bool
	// MaxPromptTokens caps the tokens of the turn's whole prompt
	// (parley.ReplyRequest.MaxPromptTokens): a request that brings its whole
	// conversation (it continues none) is held to the cap as the responder
	// tokenizes it. <= 0: no cap.
	MaxPromptTokens int
	// Scope is the reply's cache scope (parley.ReplyRequest.Scope): the
	// caller's, narrowed by its prompt_cache_key. "" is its user's.
	Scope string
	// Responder, when set, replies to this turn instead of the Service's
	// own: a turn that runs tools on the server, whose reply (a StepsReply)
	// adds its calls and their results before the final reply. Not with
	// Durable (its checkpoints keep one reply's text).
	Responder parley.Responder
}

// Response is a turn started by Respond.
type Response struct {
	*Turn
	Record ResponseRecord   // as it will be stored; usage and status are set when Events is closed
	Input  []parley.Message // the turn's input messages, the user prompt last
	Stored bool             // whether the turn will be stored (store: true)
	Model  string           // the conversation's model (Session.Model; "" with one model)
	rec    *ResponseRecord
}

// Local returns the session as the turn left it, for a NoStore turn (nil
// otherwise); pass it as ResponseRequest.Local to chain on it. Valid after
// Events is closed; nil when the turn was not committed.
func (r *Response) Local() *Session {
	if r.Turn == nil || r.capture == nil {
		return nil
	}
	return r.capture.s
}

// Final returns the record as stored, with status and usage; valid after
// Events is closed.
func (r *Response) Final() ResponseRecord { return *r.rec }

// CheckResponseInput refuses the input of a Responses request unless it ends
// with a user message (the turn's prompt). Respond checks it; the wire calls
// it too, where it reads the input, so that it refuses such a request before
// reading the rest, in the same words.
func CheckResponseInput(input []parley.Message) error {
	if len(input) == 0 || (input[len(input)-1].Role != parley.RoleUser && input[len(input)-1].Role != parley.RoleTool) {
		return parley.FieldErrorf("input", "must end with a user message or a function_call_output")
	}
	return nil
}

// checkToolResults refuses input that holds a tool result (a
// function_call_output) answering no call of the history or of the input
// before it.
func checkToolResults(history, input []parley.Message) error {
	ids := map[string]bool{}
	for _, m := range history {
		for _, c := range m.ToolCalls {
			ids[c.ID] = true
		}
	}
	for i, m := range input {
		for _, c := range m.ToolCalls {
			ids[c.ID] = true
		}
		if m.Role == parley.RoleTool && !ids[m.ToolCallID] {
			return parley.FieldErrorf(fmt.Sprintf("input[%d].call_id", i), "%q answers no function_call of this conversation", m.ToolCallID)
		}
	}
	return nil
}

// CheckResponseContinuation refuses a Responses request that continues both
// a response (previous, a response id) and a conversation. Respond checks
// it; the wire calls it too, as for CheckResponseInput.
func CheckResponseContinuation(previous, conversation string) error {
	if previous != "" && conversation != "" {
		return parley.FieldErrorf("conversation", "cannot be used together with previous_response_id")
	}
	return nil
}

// Respond starts a turn of the Responses API (see ResponseRequest). The
// returned Response's Turn behaves as Service.Turn's: the turn, and its
// record, are stored when the reply ends.
func (s *Service) Respond(ctx context.Context, who parley.Caller, req ResponseRequest) (*Response, error) {
	if err := CheckResponseInput(req.Input); err != nil {
		return nil, err
	}
	if err := CheckResponseContinuation(req.Previous, req.Conversation); err != nil {
		return nil, err
	}
	if req.Local != nil {
		req.NoStore = true
	}
	sess, unlock, prev, err := s.responseSession(ctx, who, req)
	if err != nil {
		return nil, err
	}

	// From here unlock is released on every error path or handed to start.
	if err := checkToolResults(sess.Messages, req.Input); err != nil {
		unlock()
		return nil, err
	}
	// A conversation that is kept, in the store or on the connection
	// (Local), holds the input's images: they are held to its limits
	// before anything runs or is written.
	if !req.NoStore || req.Local != nil {
		if err := s.checkImages(sess, req.Input...); err != nil {
			unlock()
			return nil, err
		}
	}
	if req.Instructions != nil {
		sess.System = *req.Instructions
	}
	rid, err := s.ids.newResponseID(ctx, sess.ID)
	if err != nil {
		unlock()
		return nil, err
	}
	start := sess.Next()
	items, last := req.Input[:len(req.Input)-1], req.Input[len(req.Input)-1]
	input := append(sess.addItems(items), last)
	p := req.Params
	sess.pruneRecords()
	sess.Responses = append(sess.Responses, ResponseRecord{
		ID: rid, Start: start, End: sess.Next() + 2, Created: time.Now().Unix(), Status: StatusCompleted,
		Instructions: sess.System, Previous: prev.ID, Listed: req.Listed,
		MaxTokens: p.MaxTokens, Temperature: p.Temperature, TopP: p.TopP,
	})
	rec := &sess.Responses[len(sess.Responses)-1]

	if req.Responder != nil && req.Durable {
		unlock()
		return nil, parley.FieldErrorf("background", "cannot be used with tools that run on the server")
	}
	out := &Response{Record: *rec, Input: input, Stored: !req.NoStore, Model: sess.Model, rec: rec}
	t := &Turn{durable: req.Durable && !req.NoStore}
	t.onFinal = func(final parley.Event, text string) {
		rec.finish(final, text)
		rec.Steps = len(t.steps)
		rec.End += rec.Steps // the server's tool calls and results come before the reply
	}
	// Another replica wrote the session while this turn ran: redo the
	// instructions, input items and record (its usage filled by now) on
	// what it stored, at the positions they take there.
	t.reapply = func(fresh *Session) {
		if req.Instructions != nil {
			fresh.System = *req.Instructions
		}
		r := *rec
		r.Start = fresh.Next()
		fresh.addItems(items)
		r.End = fresh.Next() + 2 + len(t.steps)
		fresh.pruneRecords()
		fresh.Responses = append(fresh.Responses, r)
	}
	need := -1 // an unstored turn needs no room in the store
	if req.NoStore {
		t.capture = &captureStore{cfg: newStoreConfig(nil)}
	} else {
		// A new session (a fork's copy included) stores all it holds.
		need = storedBytes(req.Input...)
		if sess.Created.IsZero() {
			need = len(sess.System) + storedBytes(sess.Messages...) + storedBytes(last)
		}
	}
	if err := s.start(ctx, t, turnStart{sess: sess, unlock: unlock, input: last, p: p, model: req.Model, need: need, r: req.Responder, stateless: req.NoStore, scope: req.Scope, maxPrompt: req.MaxPromptTokens, who: who}); err != nil {
		return nil, err
	}
	out.Turn = t
	return out, nil
}

// responseSession returns the session a Responses turn runs on, and the
// record of the response it continues (zero when none): the stored session
// itself under its lock (the caller owns unlock), or a new, unlocked copy
// (a new session, a fork of an older response, or any unstored turn's),
// whose unlock does nothing. req.Local implies req.NoStore.
func (s *Service) responseSession(ctx context.Context, who parley.Caller, req ResponseRequest) (sess *Session, unlock func(), prev ResponseRecord, err error) {
	unlock = func() {}
	switch {
	case req.Previous != "" && req.Local != nil:
		rec, ok := req.Local.Record(req.Previous)
		if !ok {
			return nil, nil, prev, parley.Errorf(parley.ENotFound, "no such response")
		}
		sess = req.Local.Clone()
		if i := rec.End - sess.Trimmed; i >= 0 && i <= len(sess.Messages) {
			sess.Messages = sess.Messages[:i]
		}
		return sess, unlock, rec, nil
	case req.Previous != "":
		sid, ok, err := s.ids.responseSession(ctx, req.Previous)
		if err != nil {
			return nil, nil, prev, err
		} else if !ok {
			return nil, nil, prev, parley.Errorf(parley.ENotFound, "no such response")
		}
		sess, u, err := s.getLocked(ctx, who, sid, "previous response")
		if err != nil {
			return nil, nil, prev, err
		}
		rec, ok := sess.Record(req.Previous)
		if !ok {
			u()
			return nil, nil, prev, parley.Errorf(parley.ENotFound, "no such response")
		}
		if rec.End == sess.Next() && !req.NoStore {
			return sess, u, rec, nil // continue the session itself
		}
		// An older response (or one not to be stored): fork a copy with the
		// history up to it, under a new id. A stored fork is a new session
		// of the requesting client.
		u()
		if !req.NoStore {
			if err := s.mayCreate(ctx, who); err != nil {
				return nil, nil, prev, err
			}
		}
		fork, err := s.fork(who, sess, rec.End)
		if err != nil {
			return nil, nil, prev, err
		}
		return fork, unlock, rec, nil
	case req.Conversation != "":
		sid, ok := ConversationSession(req.Conversation)
		if !ok {
			return nil, nil, prev, parley.Errorf(parley.ENotFound, "no such conversation")
		}
		sess, u, err := s.getLocked(ctx, who, sid, "conversation")
		if err != nil {
			return nil, nil, prev, err
		}
		if !req.NoStore {
			return sess, u, prev, nil
		}
		u()
		if sess, err = s.fork(who, sess, sess.Next()); err != nil {
			return nil, nil, prev, err
		}
		return sess, unlock, prev, nil
	default:
		if !req.NoStore {
			if err := s.mayCreate(ctx, who); err != nil {
				return nil, nil, prev, err
			}
		}
		if sess, err = s.newSession(who, req.Model); err != nil {
			return nil, nil, prev, err
		}
		return sess, unlock, prev, nil
	}
}

// fork returns a new, unstored session with sess's system prompt and
// history up to absolute position end. Positions are kept, so records of
// the copied turns stay valid in the fork. Its owner is who's client (it
// counts against whoever forks), or sess's when who names none.
func (s *Service) fork(who parley.Caller, sess *Session, end int) (*Session, error) {
	n, err := s.newSession(who, sess.Model)
	if err != nil {
		return nil, err
	}
	f := sess.Clone()
	f.ID, f.Created, f.Updated = n.ID, time.Time{}, time.Time{}
	if n.Owner != "" {
		f.Owner = n.Owner
	}
	f.User = n.User
	if i := end - f.Trimmed; i >= 0 && i <= len(f.Messages) {
		f.Messages = f.Messages[:i]
	}
	f.Responses = nil
	return f, nil
}

// finish fills the record from the reply's final event and text, before
// the Put that commits the turn stores it.
func (r *ResponseRecord) finish(ev parley.Event, text string) {
	r.Finish = string(ev.Finish)
	r.InputTokens = ev.Usage.PromptTokens
	r.CachedTokens = ev.Usage.CachedPromptTokens
	r.OutputTokens = ev.Usage.CompletionTokens
	r.ReasoningTokens = ev.Usage.ReasoningTokens
	r.Hash = textHash(text)
	switch ev.Finish {
	case parley.FinishLength:
		r.Status = StatusIncomplete
	case parley.FinishCancelled:
		r.Status = StatusCancelled
	case parley.FinishError:
		r.Status = StatusFailed
	default:
		r.Status = StatusCompleted
	}
}

// captureStore is the store of one turn with store: false: it keeps the
// session the turn commits, bounded by the default byte cap, for
// Response.Local, and nothing else. Its Put happens before the turn's
// events are closed, so reading s after that needs no lock.
type captureStore struct {
	cfg storeConfig
	s   *Session
}

func (c *captureStore) Get(context.Context, string) (*Session, error) { return nil, errNotFound() }
func (c *captureStore) Delete(context.Context, string) error          { return nil }
func (c *captureStore) Len() int                                      { return 0 }
func (c *captureStore) Close() error                                  { return nil }

func (c *captureStore) Put(_ context.Context, s *Session) error {
	cp, err := c.cfg.prepare(s)
	if err != nil {
		return err
	}
	cp.pruneRecords()
	c.s = cp
	return nil
}

// GetResponse returns the record of response id and the session it is in.
func (s *Service) GetResponse(ctx context.Context, who parley.Caller, id string) (ResponseRecord, *Session, error) {
	sid, ok, err := s.ids.responseSession(ctx, id)
	if err != nil {
		return ResponseRecord{}, nil, err
	} else if !ok {
		return ResponseRecord{}, nil, parley.Errorf(parley.ENotFound, "no such response")
	}
	sess, err := s.get(ctx, who, sid)
	if err != nil {
		return ResponseRecord{}, nil, err
	}
	rec, ok := sess.Record(id)
	if !ok {
		return ResponseRecord{}, nil, parley.Errorf(parley.ENotFound, "no such response")
	}
	rec.Instructions = sess.System
	return rec, sess, nil
}

// DeleteResponse removes response id's record and its messages from its
// session. Later turns stay (their positions shift down).
func (s *Service) DeleteResponse(ctx context.Context, who parley.Caller, id string) error {
	sid, ok, err := s.ids.responseSession(ctx, id)
	if err != nil {
		return err
	} else if !ok {
		return parley.Errorf(parley.ENotFound, "no such response")
	}
	return s.edit(ctx, who, sid, func(sess *Session) error {
		rec, ok := sess.Record(id)
		if !ok {
			return parley.Errorf(parley.ENotFound, "no such response")
		}
		sess.removeSpan(rec.Start, rec.End)
		return nil
	})
}

// removeSpan deletes the messages of absolute positions [start, end) and
// the records that overlap them, and shifts later records down.
func (s *Session) removeSpan(start, end int) {
	a, b := s.pos(start), s.pos(end-1)
	if a < 0 || b < a {
		return
	}
	s.Messages = slices.Delete(s.Messages, a, b+1)
	n := end - start
	s.Responses = slices.DeleteFunc(s.Responses, func(r ResponseRecord) bool { return r.End > start && r.Start < end })
	for i := range s.Responses {
		if s.Responses[i].Start >= end {
			s.Responses[i].Start -= n
			s.Responses[i].End -= n
		}
	}
	if len(s.Responses) == 0 {
		s.Responses = nil
	}
}

// mayCreate refuses a new session of who's client that the store would
// refuse (Admitter) or that is over the client's creation rate, before a
// turn runs for a session stored only when it ends. A refusal by the store
// spends none of the client's rate.
func (s *Service) mayCreate(ctx context.Context, who parley.Caller) error {
	client := who.Client
	if a, ok := s.store.(Admitter); ok {
		if err := a.Admit(ctx, client); err != nil {
			return err
		}
	}
	return s.creates.allow(client)
}
