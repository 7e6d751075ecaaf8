package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// TurnOption is a fact of one turn's request that the session does not
// keep (Turn, ToolTurn, Regenerate, Continue, ImageTurn take them).
type TurnOption func(*turnOptions)

// turnOptions are a turn's TurnOptions, applied.
type turnOptions struct {
	r        parley.Responder
	progress parley.LoadProgress
	scope    string
}

// ReplyWith makes r reply to the turn instead of the Service's Responder: a
// chat that runs tools on the server, whose reply (a StepsReply) adds their
// calls and results before the reply.
func ReplyWith(r parley.Responder) TurnOption { return func(o *turnOptions) { o.r = r } }

// ShowLoadProgress shows f the progress of the model load the turn's reply
// waits for, if it waits for one (parley.ReplyRequest.LoadProgress).
func ShowLoadProgress(f parley.LoadProgress) TurnOption {
	return func(o *turnOptions) { o.progress = f }
}

// InCacheScope runs the turn's reply in the cache scope scope
// (parley.ReplyRequest.Scope): the caller's, as its edge names it. Without
// it the reply uses its user's scope.
func InCacheScope(scope string) TurnOption { return func(o *turnOptions) { o.scope = scope } }

func applyTurnOptions(opts []TurnOption) turnOptions {
	var o turnOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// StepsReply is a Reply that ran tools on the server before its final
// reply (the tool loop): Steps are the messages it added to the
// conversation before that reply (assistant turns with their server tool
// calls, and the tools' results), valid after the final event. A turn
// commits them between its input and its reply.
type StepsReply interface {
	parley.Reply
	Steps() []parley.Message
}

const (
	// commitTimeout bounds the Put that commits a turn. It runs on a context
	// detached from the turn's, because a cancelled turn is committed too.
	commitTimeout = 10 * time.Second
	// turnBuffer is the capacity of Turn.Events. It must be at least 1:
	// the final event of a cancelled turn is always delivered into it.
	turnBuffer = 8
)

// Service runs conversations: it opens and resumes sessions, runs one turn
// at a time per session, and commits each finished turn to the store before
// the turn's final event is delivered. It starts one goroutine per turn
// that ends with the turn, so it needs no Close.
type Service struct {
	store  Store
	r      parley.Responder
	system string
	params parley.Params
	log    *zap.Logger
	locks  keyLock // one per session id: turns and edits of a session run one at a time
	// unused holds, per client, the sessions Open stored that have not run
	// a turn since, oldest first, at most maxUnused per client: past it the
	// client's oldest is deleted again, so connections that never talk
	// hold little and push out only their own client's sessions.
	unused  unusedSet
	creates createLimiter // sessions each client may create per minute
	served  servedSet
	ids     idCipher // response ids (ids.go)
	// maxImages caps the images of one conversation, and maxImageBytes
	// their bytes, one copy of each (images.go); <= 0: none.
	maxImages     int
	maxImageBytes int64
}

// Option configures NewService.
type Option func(*Service)

// WithSystemPrompt sets the system prompt new sessions start with.
func WithSystemPrompt(text string) Option { return func(s *Service) { s.system = text } }

// WithDefaultParams sets the parameters of sessions without their own
// (parley.DefaultParams by default).
func WithDefaultParams(p parley.Params) Option { return func(s *Service) { s.params = p } }

// WithClientLimits bounds what one client (parley.Caller.Client) may do:
// createsPerMinute sessions created per minute (a burst of as many; over
// it, ERateLimited with RetryAfter; <= 0: no limit), and maxUnused
// WebSocket sessions held that never ran a turn (past it, the client's
// oldest such session is deleted; <= 0: DefaultMaxUnused). How many
// sessions one client may hold in all is the store's WithMaxPerOwner.
func WithClientLimits(createsPerMinute, maxUnused int) Option {
	return func(s *Service) {
		s.creates.perMinute = float64(createsPerMinute)
		if maxUnused > 0 {
			s.unused.maxPer = maxUnused
		}
	}
}

// WithServiceClock replaces time.Now for the per-client creation rate.
func WithServiceClock(now func() time.Time) Option {
	return func(s *Service) { s.creates.now = now }
}

// WithLogger sets the service's logger; the default discards.
func WithLogger(l *zap.Logger) Option { return func(s *Service) { s.log = l } }

// NewService returns a Service over store and r. The store stays the
// caller's: close it after the last turn has ended.
func NewService(store Store, r parley.Responder, opts ...Option) *Service {
	s := &Service{store: store, r: r, params: parley.DefaultParams(), log: zap.NewNop()}
	s.creates.now = time.Now
	s.unused.maxPer = DefaultMaxUnused
	for _, o := range opts {
		o(s)
	}
	s.ids.store = store
	return s
}

// Open starts or resumes a session: OpenModel with the default model.
func (s *Service) Open(ctx context.Context, who parley.Caller, id string) (*Session, bool, error) {
	return s.OpenModel(ctx, who, id, "")
}

// OpenModel starts or resumes a session. id "" starts a new session with
// the default system prompt, held with model ("" the default; see
// Session.Model) (resumed false), owned by who, its user and client, and stores it, so a client that reconnects with its id (after a server restart, say)
// resumes it. It counts against the client's creation rate and the store's
// per-client cap (ERateLimited past either, EStoreFull when the store is
// full). Per client, at most maxUnused sessions stored this way that never
// ran a turn are kept (a reset or a system prompt does not count as a
// turn): past that the client's oldest is deleted, so connections that
// never talk hold little and push out only their own. A known id
// returns its session (resumed true). An unknown, expired or malformed id
// is a parley ENotFound error: a client cannot pick its own id.
func (s *Service) OpenModel(ctx context.Context, who parley.Caller, id, model string) (*Session, bool, error) {
	if id == "" {
		if err := s.creates.allow(who.Client); err != nil {
			return nil, false, err
		}
		sess, err := s.newSession(who, model)
		if err != nil {
			return nil, false, err
		}
		// Stored now, not at the first turn, so a client that reconnects
		// with the id it was given (after a server restart, say) resumes
		// it. One small record; the store's session caps and TTL bound them
		// like any other.
		if err := s.put(ctx, sess); err != nil {
			return nil, false, fmt.Errorf("create session: %w", err)
		}
		for _, old := range s.unused.add(sess.Owner, sess.ID) {
			s.dropUnused(ctx, old)
		}
		return sess, false, nil
	}
	if !ValidID(id) {
		return nil, false, errNotFound()
	}
	sess, err := s.get(ctx, who, id)
	if err != nil {
		return nil, false, fmt.Errorf("resume session: %w", err)
	}
	return sess, true, nil
}

// Params returns the parameters sess's turns use by default: its own
// overrides, or the service's defaults.
func (s *Service) Params(sess *Session) parley.Params {
	if sess != nil && sess.Params != nil {
		return *sess.Clone().Params
	}
	p := s.params
	p.Stop = slices.Clone(p.Stop)
	p.JSONSchema = slices.Clone(p.JSONSchema)
	return p
}

// Reset clears the session's history and keeps its system prompt and
// settings. It waits for a running turn of the session to end.
func (s *Service) Reset(ctx context.Context, who parley.Caller, id string) error {
	return s.update(ctx, who, id, func(sess *Session) error {
		sess.Messages = nil
		return nil
	})
}

// SetSystem replaces the session's system prompt ("" removes it). It waits
// for a running turn of the session to end.
func (s *Service) SetSystem(ctx context.Context, who parley.Caller, id, text string) error {
	return s.update(ctx, who, id, func(sess *Session) error {
		sess.System = text
		return nil
	})
}

// SetModel picks the model of a session that has not run a turn yet (see
// Session.Model). A session with a history keeps the model it was held
// with: naming another is an EInvalid error on field model.
func (s *Service) SetModel(ctx context.Context, who parley.Caller, id, model string) error {
	return s.update(ctx, who, id, func(sess *Session) error {
		if len(sess.Messages) > 0 && sess.Model != model {
			return parley.FieldErrorf("model", "this conversation is held with model %q; open a new session with ?model=%s to talk to %s", sess.Model, model, model)
		}
		sess.Model = model
		return nil
	})
}

// SetParams stores per-session parameters (nil returns the session to the
// defaults). They are validated here, so a bad value is refused when set,
// not at the next turn. It waits for a running turn of the session to end.
func (s *Service) SetParams(ctx context.Context, who parley.Caller, id string, p *parley.Params) error {
	if p != nil {
		if err := p.Validate(0); err != nil {
			return err
		}
	}
	return s.update(ctx, who, id, func(sess *Session) error {
		sess.Params = (&Session{Params: p}).Clone().Params
		return nil
	})
}

// load returns the stored session of who's user, or a new one (owned by
// who, with model) for an id that Open issued and nothing has written yet (or
// that expired while its connection stayed open: it starts over). Callers
// only pass ids that Open returned, so a client still cannot pick its own.
func (s *Service) load(ctx context.Context, who parley.Caller, id, model string) (*Session, error) {
	sess, err := s.store.Get(ctx, id)
	if parley.ErrorCode(err) == parley.ENotFound {
		return &Session{ID: id, System: s.system, Owner: who.Client, User: who.User, Model: model}, nil
	}
	if err == nil && !ownedBy(who, sess) {
		return nil, errNotFound()
	}
	return sess, err
}

// get reads session id as who's user may see it: another user's session is
// a parley ENotFound error, the same as an unknown id, so an id tells
// nobody else even that it exists. Every read on behalf of a request goes
// through it.
func (s *Service) get(ctx context.Context, who parley.Caller, id string) (*Session, error) {
	sess, err := s.store.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ownedBy(who, sess) {
		return nil, errNotFound()
	}
	return sess, nil
}

// ownedBy reports whether sess belongs to who's user. User names are not
// secrets (the keys that map to them are), so a plain comparison will do.
func ownedBy(who parley.Caller, sess *Session) bool {
	return sess.User == who.User
}

// newSession returns a new, unstored session owned by who, with
// the service's system prompt and model. It is the one place the Service mints
// session ids (Open, CreateConversation, a new or forked Responses turn);
// the caller checks the client's creation limits first.
func (s *Service) newSession(who parley.Caller, model string) (*Session, error) {
	id, err := NewID()
	if err != nil {
		return nil, err
	}
	return &Session{ID: id, System: s.system, Owner: who.Client, User: who.User, Model: model}, nil
}

// update applies f to the stored session under the session's lock (an id
// Open issued and nothing wrote yet starts from a new session).
func (s *Service) update(ctx context.Context, who parley.Caller, id string, f func(*Session) error) error {
	return s.modify(ctx, id, func(ctx context.Context, id string) (*Session, error) { return s.load(ctx, who, id, "") }, f)
}

// lockSession takes session id's lock; on success the caller owns it and
// must call unlock. A malformed id is ENotFound, as an unknown one is.
func (s *Service) lockSession(ctx context.Context, id string) (unlock func(), err error) {
	if !ValidID(id) {
		return nil, errNotFound()
	}
	if unlock, err = s.locks.lock(ctx, id); err != nil {
		return nil, fmt.Errorf("wait for session: %w", err)
	}
	return unlock, nil
}

// getLocked takes session sid's lock and reads the stored session; on
// success the caller owns the lock and must call unlock. what names the
// session in errors.
func (s *Service) getLocked(ctx context.Context, who parley.Caller, sid, what string) (sess *Session, unlock func(), err error) {
	if unlock, err = s.lockSession(ctx, sid); err != nil {
		return nil, nil, err
	}
	if sess, err = s.get(ctx, who, sid); err != nil {
		unlock()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return sess, unlock, nil
}

// edit applies f to the stored session sid under its lock; unlike update,
// the session must exist.
func (s *Service) edit(ctx context.Context, who parley.Caller, sid string, f func(*Session) error) error {
	return s.modify(ctx, sid, func(ctx context.Context, id string) (*Session, error) { return s.get(ctx, who, id) }, f)
}

// modify reads the session with get, applies f and stores it, all under
// the session's lock; when another replica wrote the session in between
// (ErrConflict), it reads it again and reapplies f.
func (s *Service) modify(ctx context.Context, id string, get func(context.Context, string) (*Session, error), f func(*Session) error) error {
	unlock, err := s.lockSession(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	for attempt := 0; ; attempt++ {
		sess, err := get(ctx, id)
		if err != nil {
			return err
		}
		if err := f(sess); err != nil {
			return err
		}
		// Not s.unused.used: an edit (a reset, a system prompt) is not a
		// turn, so a socket that only edits stays unused.
		err = s.put(ctx, sess)
		if !errors.Is(err, ErrConflict) || attempt == conflictRetries {
			return err
		}
		// Another replica wrote the session since we read it: read it again
		// and apply the change to what it wrote.
		backoff(ctx, attempt)
	}
}

// dropUnused deletes a session stored at creation that has no messages
// (under its lock, so a turn starting now is not lost). A system prompt or
// settings set since do not keep it.
func (s *Service) dropUnused(ctx context.Context, id string) {
	unlock, err := s.locks.lock(ctx, id)
	if err != nil {
		return
	}
	defer unlock()
	sess, err := s.store.Get(ctx, id)
	if err != nil || len(sess.Messages) > 0 {
		return
	}
	if err := s.store.Delete(ctx, id); err != nil {
		s.log.Debug("drop unused session", zap.String("session", id), zap.Error(err))
		return
	}
	s.log.Debug("dropped unused session", zap.String("session", id), zap.String("client", sess.Owner))
}

// Turn is one prompt and its streamed reply. Its goroutine ends when the
// reply ends; the caller must either read Events until it is closed or
// cancel the context given to Service.Turn (after which reading may stop at
// any point: nothing blocks on an abandoned Turn).
type Turn struct {
	id     string
	who    parley.Caller // whom it is for (see Service.Turn); set before it starts
	reply  parley.Reply
	events chan parley.Event

	// committed is written before events is closed and read after.
	committed bool

	// resumedHere: the history this turn continues is the one this Service
	// committed last for the session (so this replica's KV cache may hold it).
	resumedHere bool
	kv          string // KVNew, KVWarm or KVRebuilt; set before events is closed

	// onFinal, when set, sees the reply's final event and text before the
	// turn is committed (a Responses turn fills its record with them).
	onFinal func(final parley.Event, text string)

	// reapply, when set, adds what the turn changed in the session besides
	// its prompt and reply (a Responses turn's input items and record) to
	// a fresh copy, when committing meets another replica's write.
	reapply func(*Session)

	// durable: the turn is stored, marked interrupted, before its reply
	// starts, and its reply so far at checkpoints (pending.go); its commit
	// then replaces that. input is the turn's new message.
	durable bool
	input   parley.Message
	// prefix, for a Continue turn, is the reply it carries on: its text
	// comes before the new text in Text, checkpoints and the commit.
	prefix *parley.Message
	// revert, when set, is the session as it was before a durable turn
	// (a chat turn): what is stored again when the reply fails, so a
	// failed reply leaves the history as it was. Without it (a background
	// response) the pending record stays, interrupted.
	revert *Session

	// settleMu is held while the turn is committed; settled (guarded by
	// it) is set once the commit is decided, stored or not. See Snapshot.
	settleMu sync.Mutex
	settled  bool
	// toolCalls are the reply's tool calls; set before events is closed.
	toolCalls []parley.ToolCall
	// steps are the messages a StepsReply added before its final reply;
	// set before onFinal is called.
	steps []parley.Message

	// capture, when set, is where a turn that is not to be stored
	// (store: false) commits instead of the store; such a turn leaves the
	// service's own bookkeeping (unused sessions, served versions) alone.
	capture *captureStore
}

// Events yields the reply's token events, then exactly one final event
// (Done set), then is closed. When the final event arrives, the user
// message and the reply are already stored, except:
//   - the reply failed (Finish error): nothing is stored;
//   - the reply was cancelled before any text: nothing is stored;
//   - storing failed: the final event becomes Finish error, Err says why.
//
// Once the context given to Service.Turn is done, token events the reader
// does not take at once are dropped; the final event is always delivered.
func (t *Turn) Events() <-chan parley.Event { return t.events }

// SessionID is the id of the turn's session.
func (t *Turn) SessionID() string { return t.id }

// Text is the reply's whole text (a Continue turn's: the reply it carried
// on, then the new text); valid after the final event.
func (t *Turn) Text() string {
	if t.prefix != nil {
		return t.prefix.Content + t.reply.Text()
	}
	return t.reply.Text()
}

// Reasoning is the reply's thought (a reasoning model's, kept apart from
// Text); valid after the final event.
func (t *Turn) Reasoning() string {
	var prev string
	if t.prefix != nil {
		prev = t.prefix.Reasoning
	}
	return prev + t.reply.Reasoning()
}

// Input is the message the turn answers: the user's prompt (a Regenerate's
// or a Continue's, the conversation's last one), or a tool's result.
func (t *Turn) Input() parley.Message { return t.input }

// Prefix is the text a Continue turn carries on ("" for any other turn):
// Text is Prefix and then the new text the token events carry.
func (t *Turn) Prefix() string {
	if t.prefix == nil {
		return ""
	}
	return t.prefix.Content
}

// Prompt is the prompt as the model saw it (the rendered conversation).
func (t *Turn) Prompt() string { return t.reply.Prompt() }

// ToolCalls returns the reply's tool calls; valid after Events is closed.
func (t *Turn) ToolCalls() []parley.ToolCall { return t.toolCalls }

// Committed reports whether the turn was stored; valid after Events is closed.
func (t *Turn) Committed() bool { return t.committed }

// Turn adds prompt to the session's conversation and starts the reply.
// Only one turn per session runs at a time: while another runs, Turn waits
// for it to end (queued turns run in arrival order) or for ctx to be done.
//
// p are the reply's parameters, validated by the caller (the wire's edge;
// the engine checks them again at its door); a zero p (MaxTokens 0) means
// the session's own (see Params). The new user message is stored before the reply starts,
// with an empty reply marked interrupted, and the reply's text so far at
// checkpoints while it runs (pending.go), so a crash never loses what the
// user typed; the turn's commit replaces that when the reply ends (see
// Turn.Events). A failed reply leaves the history as it was.
func (s *Service) Turn(ctx context.Context, who parley.Caller, id, prompt string, p parley.Params, opts ...TurnOption) (*Turn, error) {
	if prompt == "" {
		return nil, parley.FieldErrorf("prompt", "must not be empty")
	}
	return s.turn(ctx, who, id, parley.Message{Role: parley.RoleUser, Content: prompt}, p, opts)
}

// ToolTurn is Turn for a tool's result: content answers the call callID of
// the session's last reply (an EInvalid error naming tool_call_id when no
// message of the history made that call), and the reply continues from it.
func (s *Service) ToolTurn(ctx context.Context, who parley.Caller, id, callID, content string, p parley.Params, opts ...TurnOption) (*Turn, error) {
	if callID == "" {
		return nil, parley.FieldErrorf("tool_call_id", "is required")
	}
	return s.turn(ctx, who, id, parley.Message{Role: parley.RoleTool, Content: content, ToolCallID: callID}, p, opts)
}

// Regenerate replaces the last reply of session id: it drops the
// conversation's last user prompt and everything after it (the reply, its
// tool calls and results), then runs that prompt again as a new turn, so
// the stored session holds the new reply in place of the old one. A
// conversation without a prompt is a parley EInvalid error.
func (s *Service) Regenerate(ctx context.Context, who parley.Caller, id string, p parley.Params, opts ...TurnOption) (*Turn, error) {
	return s.turn(ctx, who, id, parley.Message{}, p, opts)
}

// roleContinue marks Continue's turn inside the Service (never stored).
const roleContinue parley.Role = "continue"

// Continue carries on the session's last reply, one cut short by its length
// limit, a stop string or a cancel: the model continues its text (the chat
// request's parley.ReplyRequest.Continue), and the stored session holds the reply
// whole, its text then the new, in place of the old. Turn.Text is the whole
// reply; the token events are the new text. A conversation that does not
// end with a reply (or ends with one that called tools) is a parley
// EInvalid error.
func (s *Service) Continue(ctx context.Context, who parley.Caller, id string, p parley.Params, opts ...TurnOption) (*Turn, error) {
	return s.turn(ctx, who, id, parley.Message{Role: roleContinue}, p, opts)
}

// dropLastReplyToContinue removes the last reply and the message it
// answered, and returns both and the answered message's absolute position.
func (s *Session) dropLastReplyToContinue() (input, reply parley.Message, abs int, err error) {
	n := len(s.Messages)
	if n < 2 || s.Messages[n-1].Role != parley.RoleAssistant || len(s.Messages[n-1].ToolCalls) > 0 ||
		(s.Messages[n-2].Role != parley.RoleUser && s.Messages[n-2].Role != parley.RoleTool) {
		return input, reply, 0, parley.Errorf(parley.EInvalid, "there is no reply to continue: the conversation does not end with a reply to a prompt")
	}
	input, reply, abs = s.Messages[n-2], s.Messages[n-1], s.Trimmed+n-2
	s.removeSpan(abs, s.Next())
	return input, reply, abs, nil
}

// dropLastReply removes the last user message and what follows it, and
// returns that message and its absolute position.
func (s *Session) dropLastReply() (parley.Message, int, error) {
	for i := len(s.Messages) - 1; i >= 0; i-- {
		if m := s.Messages[i]; m.Role == parley.RoleUser {
			abs := s.Trimmed + i
			s.removeSpan(abs, s.Next())
			return m, abs, nil
		}
	}
	return parley.Message{}, 0, parley.Errorf(parley.EInvalid, "there is no reply to regenerate: the conversation has no prompt")
}

// turn adds input, a user's prompt or a tool's result, to the session's
// conversation and starts the reply (see Turn).
func (s *Service) turn(ctx context.Context, who parley.Caller, id string, input parley.Message, p parley.Params, opts []TurnOption) (*Turn, error) {
	if !ValidID(id) {
		return nil, errNotFound()
	}
	unlock, err := s.locks.lock(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("wait for turn: %w", err)
	}
	// From here the lock is released on every error path, or handed to start.
	sess, err := s.load(ctx, who, id, "")
	if err != nil {
		unlock()
		return nil, err
	}
	var reapply func(*Session)
	var prefix *parley.Message // Continue: the reply carried on
	revert := sess
	// A Regenerate or a Continue runs a prompt the conversation holds
	// already: its images were held to the limits when it was sent.
	rerun := input.Role == "" || input.Role == roleContinue
	switch input.Role {
	case "": // Regenerate
		revert = sess.Clone() // the old reply comes back if the new one fails
		var from int
		if input, from, err = sess.dropLastReply(); err != nil {
			unlock()
			return nil, err
		}
		// Another replica's write found at commit (ErrConflict) keeps
		// the drop: the reply goes from the same position in its copy.
		reapply = func(fresh *Session) { fresh.removeSpan(from, fresh.Next()) }
	case roleContinue:
		revert = sess.Clone()
		var from int
		var reply parley.Message
		if input, reply, from, err = sess.dropLastReplyToContinue(); err != nil {
			unlock()
			return nil, err
		}
		prefix = &parley.Message{Role: parley.RoleAssistant, Content: reply.Content, Reasoning: reply.Reasoning}
		reapply = func(fresh *Session) { fresh.removeSpan(from, fresh.Next()) }
	}
	if !rerun {
		if err := s.checkImages(sess, input); err != nil {
			unlock()
			return nil, err
		}
	}
	if input.Role == parley.RoleTool {
		if err := checkToolResults(sess.Messages, []parley.Message{input}); err != nil {
			unlock()
			return nil, parley.FieldErrorf("tool_call_id", "%q answers no tool call of this conversation", input.ToolCallID)
		}
	}
	if p.MaxTokens == 0 {
		skip := p.SkipLogprobs // the caller's, not a setting
		p = s.Params(sess)
		p.SkipLogprobs = skip
	}
	t := &Turn{resumedHere: len(sess.Messages) > 0 && s.served.holds(id, sess.Updated), reapply: reapply,
		durable: true, prefix: prefix}
	if revert != sess {
		t.revert = revert
	} else {
		t.revert = sess.Clone()
	}
	if len(sess.Messages) == 0 {
		t.kv = KVNew
	}
	need := storedBytes(input)
	o := applyTurnOptions(opts)
	if err := s.start(ctx, t, turnStart{sess: sess, unlock: unlock, input: input, p: p, need: need, r: o.r, progress: o.progress, cont: prefix != nil, scope: o.scope, who: who}); err != nil {
		return nil, err
	}
	return t, nil
}

// turnStart is a turn ready to start, as Turn and Respond prepare it.
type turnStart struct {
	who    parley.Caller  // whom the turn is for: its reply's user and client
	sess   *Session       // the session the turn continues, its other changes (a Responses turn's input items, record) made
	unlock func()         // releases sess's lock (a no-op for an unlocked copy); start owns it
	input  parley.Message // the new message: the user's prompt, or a tool's result (a Responses turn)
	p      parley.Params
	// r, when set, replies instead of the Service's Responder (a turn that
	// runs tools on the server).
	r parley.Responder
	// progress, when set, is shown the load of the model the reply waits for.
	progress parley.LoadProgress
	// cont asks the reply to carry on the conversation's last message (a
	// Continue turn: parley.ReplyRequest.Continue).
	cont bool
	// model is the model the request named ("" the default); a session
	// that holds a model of its own answers with that one.
	model string
	// need is the bytes the store must have room for before the reply
	// starts (see room); < 0 for a turn that is not stored.
	need int
	// maxPrompt caps the tokens of the reply's whole prompt
	// (parley.ReplyRequest.MaxPromptTokens; <= 0: none).
	maxPrompt int
	// scope is the reply's cache scope ("" its user's: see
	// parley.ReplyRequest.Scope).
	scope string
	// stateless: the turn is never stored (an unstored Responses turn), so
	// its reply is a stateless request (parley.ReplyRequest.Stateless).
	stateless bool
}

// start is what every turn shares once its session is locked and ready:
// check the store has room for it, ask for the reply to the session's
// system prompt, history and ts.prompt, and start the goroutine that
// streams t (which carries its API's own fields; start sets the rest) and
// commits it. ts.unlock is start's from the call on: released on error, or
// by the turn's goroutine when the turn has ended.
func (s *Service) start(ctx context.Context, t *Turn, ts turnStart) error {
	sess := ts.sess
	if ts.need >= 0 {
		if err := s.room(ctx, sess.Owner, ts.need); err != nil {
			ts.unlock()
			return err
		}
	}
	t.input, t.who = ts.input, ts.who
	if t.durable {
		if err := s.storePendingTurn(ctx, t, sess); err != nil {
			ts.unlock()
			return err
		}
		// A fresh copy read after another replica's write (commit's retry)
		// holds this turn's pending write: drop it before redoing the turn.
		prev := t.reapply
		t.reapply = func(fresh *Session) {
			dropPending(fresh, ts.input)
			if prev != nil {
				prev(fresh)
			}
		}
	}
	msgs := make([]parley.Message, 0, len(sess.Messages)+2)
	if sess.System != "" {
		msgs = append(msgs, parley.Message{Role: parley.RoleSystem, Content: sess.System})
	}
	msgs = append(msgs, sess.Messages...)
	msgs = append(msgs, ts.input)
	if t.prefix != nil {
		msgs = append(msgs, *t.prefix)
	}
	msgs = withImageData(msgs)
	// The conversation's model, whatever the request named.
	model := cmp.Or(sess.Model, ts.model)
	r := s.r
	if ts.r != nil {
		r = ts.r
	}
	req := parley.ReplyRequest{Key: sess.ID, Model: model, Client: ts.who.Client, User: ts.who.User, Scope: ts.scope, Messages: msgs, Params: ts.p, LoadProgress: ts.progress, Continue: ts.cont, Stateless: ts.stateless, MaxPromptTokens: ts.maxPrompt}
	reply, err := r.Reply(ctx, req)
	if err != nil {
		s.undoPending(ctx, t, sess)
		ts.unlock()
		if sess.Model != "" && parley.ErrorCode(err) == parley.ENotFound {
			return parley.Errorf(parley.ENotFound, "this conversation was held with model %q, which this server no longer serves (%s); start a new conversation", sess.Model, parley.ErrorMessage(err))
		}
		return err
	}
	t.id, t.reply, t.events = sess.ID, reply, make(chan parley.Event, turnBuffer)
	go s.run(ctx, t, sess, ts.input, ts.unlock)
	return nil
}

// run forwards the reply's events, commits the turn when the final event
// arrives, and then forwards the final event. It owns unlock and t.events.
func (s *Service) run(ctx context.Context, t *Turn, sess *Session, input parley.Message, unlock func()) {
	defer close(t.events)
	defer unlock() // runs first: once Events is closed, the next turn may start at once

	var final parley.Event
	ended := false
	var cp *checkpointer
	if t.durable {
		cp = s.newCheckpointer(sess, input, t.prefix)
	}
	for ev := range t.reply.Events() {
		if ev.Done {
			final, ended = ev, true
			break // the reply closes its channel after the final event
		}
		if cp != nil {
			cp.add(ctx, ev)
		}
		t.send(ctx, ev)
	}
	if !ended {
		final = parley.Event{Done: true, Finish: parley.FinishError,
			Err: parley.Errorf(parley.EInternal, "the reply ended without a final event")}
	} else {
		if sr, ok := t.reply.(StepsReply); ok {
			t.steps = sr.Steps()
		}
		if t.onFinal != nil {
			t.onFinal(final, t.reply.Text())
		}
	}

	if t.kv == "" {
		t.kv = KVRebuilt
		if t.resumedHere && final.Usage.CachedPromptTokens > 0 {
			t.kv = KVWarm
		}
	}
	t.sendFinal(ctx, s.settle(ctx, t, sess, input, final))
}

// settle commits the turn whose reply ended with final (a failed reply, and
// a cancelled one without text, are not stored; a cancelled one with text is
// stored marked interrupted, and so is one without text that the server's
// shutdown cancelled: its prompt, still waiting for the engine, is kept as
// pending rather than lost) and returns the final event to deliver. It
// holds t.settleMu throughout, so Snapshot sees the turn either settled
// (stored, or known not to be) or still to come, never half way.
func (s *Service) settle(ctx context.Context, t *Turn, sess *Session, input parley.Message, final parley.Event) parley.Event {
	t.settleMu.Lock()
	defer t.settleMu.Unlock()
	t.settled = true
	text := t.Text()
	shutdown := errors.Is(context.Cause(ctx), parley.ErrShuttingDown)
	if final.Finish == parley.FinishError || (final.Finish == parley.FinishCancelled && text == "" && !t.durable && !shutdown) {
		// A durable turn's pending record stays, interrupted, but for a
		// chat turn's failed reply, which leaves the history as it was.
		if final.Finish == parley.FinishError {
			s.undoPending(ctx, t, sess)
		}
		return final
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	put := s.put
	if t.capture != nil {
		put = t.capture.Put
	} else {
		s.unused.used(sess.Owner, t.id)
	}
	t.toolCalls = final.ToolCalls
	reply := parley.Message{Role: parley.RoleAssistant, Content: text, Reasoning: t.Reasoning(), ToolCalls: final.ToolCalls,
		Interrupted: final.Finish == parley.FinishCancelled}
	turn := append(append([]parley.Message{input}, t.steps...), reply) // reply keeps its tool calls
	if err := s.commit(cctx, t.who, put, sess, turn, t.reapply); err != nil {
		// The reply was streamed but not stored: say so in the final
		// event (the wire shows it before the sentinel) instead of
		// logging here; the final event is where this error ends.
		final.Finish, final.Err = parley.FinishError, fmt.Errorf("save turn: %w", err)
		return final
	}
	t.committed = true
	if t.capture == nil {
		s.served.record(t.id, sess.Updated)
	}
	s.log.Debug("turn committed", zap.String("session", t.id),
		zap.String("finish", string(final.Finish)), zap.Int("messages", len(sess.Messages)))
	return final
}

// undoPending stores t.revert again in place of a durable chat turn's
// pending write, when its reply fails (sess carries that write's version).
// A failure is logged: the pending turn then stays, marked interrupted.
func (s *Service) undoPending(ctx context.Context, t *Turn, sess *Session) {
	if !t.durable || t.revert == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	r := t.revert.Clone()
	r.Created, r.Updated = sess.Created, sess.Updated
	if err := s.put(cctx, r); err != nil {
		s.log.Warn("undo a failed reply's pending turn", zap.String("session", sess.ID), zap.Error(err))
		return
	}
	sess.Created, sess.Updated = r.Created, r.Updated
}

// send delivers a token event, or drops it once ctx is done and the reader
// is not there to take it.
func (t *Turn) send(ctx context.Context, ev parley.Event) {
	select {
	case t.events <- ev:
		return
	case <-ctx.Done():
	}
	select {
	case t.events <- ev:
	default:
	}
}

// sendFinal delivers the final event without ever blocking once ctx is
// done: if a reader that gave up left the buffer full, it drops the oldest
// buffered token to make room. run is the only sender, so after one
// receive the next send finds space.
func (t *Turn) sendFinal(ctx context.Context, ev parley.Event) {
	select {
	case t.events <- ev:
		return
	case <-ctx.Done():
	}
	for {
		select {
		case t.events <- ev:
			return
		default:
		}
		select {
		case <-t.events:
		default:
		}
	}
}
