package chat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/media"
)

// Generator is what chat needs from the engine (llm.Engine satisfies it).
//
// Contract: Generate returns at once, with an error (parley EBusy, EInvalid,
// ETooLarge, ...) when it refuses the request. Its channel carries token
// events, whose Token.Text is the raw piece (possibly part of a UTF-8
// character), then exactly one event with Done set (finish reason, usage,
// timings), and is then closed. The final event always fits in the channel's
// buffer. Cancelling ctx ends generation within one step.
type Generator interface {
	Info() parley.ModelInfo
	Tokenize(text string) ([]int, error) // adds BOS when the model wants it, parses special tokens
	Generate(ctx context.Context, req parley.GenerateRequest) (<-chan parley.Event, error)
}

// ErrNoFinalEvent is the Err of the final event a Reply makes up when the
// engine closes its stream without one (a broken engine contract).
var ErrNoFinalEvent = errors.New("engine closed the stream without a final event")

// maxEventBuffer bounds the buffer of a Reply's event channel, in events
// (about 130 bytes each). Replies up to this length never wait for their
// consumer, so a slow client cannot hold back the engine's decode loop.
const maxEventBuffer = 4096

// abandonAfter is how long a reply waits for the engine to end its stream
// after generation was cancelled (by the caller, a stop string or a
// shutdown) before it ends the reply without it. The engine normally ends
// within one decode step, milliseconds; this bounds a step stuck in C.
const abandonAfter = time.Second

// dropBlock is how many turns are dropped at a time when the history
// outgrows the window (see FitStable): the prompt's prefix, and so the KV
// cache, then survives up to this many further turns.
const dropBlock = 4

// Option configures a Responder.
type Option func(*Responder)

// WithTemplate overrides the chat template detected from the model
// (see TemplateByName).
func WithTemplate(t Template) Option {
	return func(r *Responder) { r.tmpl = t }
}

// WithTemplateSource renders with the Jinja template src instead of the
// model's own (a template file the operator chose).
func WithTemplateSource(src string) Option {
	return func(r *Responder) { r.jinjaSrc = src }
}

// WithJinjaRenderer sets what renders Jinja templates: a *Sandbox for a
// GGUF's (untrusted) template. The default renders in process, unbounded.
func WithJinjaRenderer(jr JinjaRenderer) Option {
	return func(r *Responder) { r.renderer = jr }
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *zap.Logger) Option {
	return func(r *Responder) { r.log = l }
}

// Responder produces replies: it renders and fits a conversation, tokenizes
// it, starts generation and cleans the token stream. It holds no
// conversation state (the session layer does, and owns the system prompt)
// and is safe for concurrent use. It remembers, per key, the exact tokens of
// the last prompt and reply (a cache: losing it costs one full tokenization),
// so replies for one key must not run concurrently when the key is to be
// reused well (the session layer runs one turn at a time).
type Responder struct {
	gen        Generator
	tmpl       Template // nil: the model's own template (auto)
	jinjaSrc   string   // a Jinja template that replaces the model's ("": the model's)
	renderer   JinjaRenderer
	images     ImageDecoder // nil: conversations with images are refused
	imageStats *media.Stats // counts the images refused here (nil: none)
	auto       autoTemplate
	log        *zap.Logger
	memos      memos // the last turn of each conversation, by key (see memo)
}

// NewResponder returns a Responder over gen.
func NewResponder(gen Generator, opts ...Option) *Responder {
	r := &Responder{gen: gen, log: zap.NewNop()}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Template returns the template replies are rendered with: the override, or
// the model's own chat template (see loadTemplate), loaded once per source.
func (r *Responder) Template() Template {
	if r.tmpl != nil {
		return r.tmpl
	}
	return r.auto.get(r.gen.Info(), r.jinjaSrc, r.renderer, r.log)
}

// Reply starts the assistant's reply to req.Messages (the whole
// conversation, system prompt included, ending with the user's message):
// parley.Responder's Reply. It renders msgs
// with the template, drops the oldest turns until the prompt leaves
// p.MaxTokens of the context free, tokenizes, and calls Generate with key
// (the KV-cache key, a session id). Stop strings are p.Stop and the
// template's end-of-turn strings.
//
// The caller must either read Events until it is closed or cancel ctx;
// after cancelling it may stop reading. Errors are parley *Errors where the
// request is at fault: EInvalid (bad role, max_tokens too large for the
// context), ETooLarge (the newest turn alone does not fit), or the engine's.
//
// key is taken within req's cache scope (parley.ScopedKey): the memo, the
// saved KV state and the slot of one user's conversation are never another
// user's, whatever key the other sends.
func (r *Responder) Reply(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	rep, err := r.reply(ctx, req)
	if err != nil {
		return nil, err // never a nil *Reply in a non-nil parley.Reply
	}
	return rep, nil
}

// reply is Reply's work.
func (r *Responder) reply(ctx context.Context, req parley.ReplyRequest) (*Reply, error) {
	scope := req.CacheScope()
	key, msgs, p, prefill := parley.ScopedKey(scope, req.Key), req.Messages, req.Params, req.Continue
	if len(msgs) == 0 {
		return nil, parley.FieldErrorf("messages", "at least one message is needed")
	}
	info := r.gen.Info()
	budget := info.ContextLength - p.MaxTokens
	if budget < 1 {
		return nil, parley.FieldErrorf("max_tokens", "must be less than the context length (%d tokens), got %d", info.ContextLength, p.MaxTokens)
	}
	tmpl := r.Template()
	opt, ts, stops, err := toolSetup(tmpl, &p)
	if err != nil {
		return nil, err
	}
	opt.Tools = neutralizeTools(opt.Tools, info.ControlTokens)
	// Images: the prompt holds a marker where each goes, and no client text may spell one.
	hasImages := parley.ImageCount(msgs) > 0
	controls := info.ControlTokens
	if hasImages {
		if err := r.checkImages(msgs, info); err != nil {
			return nil, err
		}
		controls = append(append([]string(nil), controls...), parley.ImageMarker)
		if j, ok := tmpl.(*Jinja); ok && j.imageText() != "" {
			controls = append(controls, j.imageText()) // what the template writes for an image
		}
	}
	// A continuation (parley.ReplyRequest.Continue) renders the messages
	// before the last one, an assistant reply, with the generation prompt,
	// and ends the prompt with that reply's text: the model carries it on.
	if prefill && msgs[len(msgs)-1].Role != parley.RoleAssistant {
		return nil, parley.Errorf(parley.EInvalid, "there is no reply to continue: the conversation does not end with one")
	}
	render := func(cand []parley.Message) (string, error) {
		cand = neutralize(cand, controls)
		if hasImages && !typedImages(tmpl) {
			cand = withImageMarkers(cand)
		}
		if !prefill {
			return tmpl.Render(cand, opt)
		}
		n := len(cand)
		prompt, err := tmpl.Render(cand[:n-1], opt)
		return prompt + cand[n-1].Content, err
	}

	// Every image of the conversation, decoded (the decoder keeps recent ones), and the positions each takes:
	// fitting counts them, and the kept turns' images are the last ones (turns drop oldest first).
	var allImages []parley.Image
	var positions []int
	if hasImages {
		var err error
		if allImages, err = r.decodeImages(ctx, scope, msgs); err != nil {
			return nil, err
		}
		if positions, err = r.imagePositions(allImages); err != nil {
			return nil, err
		}
	}

	// The memo of this conversation's last turn, when msgs continue it:
	// fitting starts from the turns it dropped, and prompts are built from its
	// exact tokens. Whether msgs continue it is checked on the rendered text
	// (extend); a conversation that was reset has fewer messages.
	tk, _ := r.gen.(ContinuationTokenizer)
	if hasImages {
		// The memo extends a prompt by tokenizing its new text alone, which knows no images: a conversation
		// with images is tokenized whole each turn (the engine still reuses its cached prefix, images included).
		tk = nil
	}
	m := r.memoFor(key, msgs, tk)

	// Fit counts several candidate prompts; keep each one's tokens so the
	// chosen prompt is not tokenized twice. Candidates differ in length, so
	// the message count identifies them. Every candidate holds only the
	// messages that may be kept, so with a memo no step here looks at the
	// history dropped before (neutralize included).
	type rendered struct {
		prompt string
		tokens []int
		cont   bool // the prompt continues the memo's
	}
	seen := make(map[int]rendered)
	// Tokenizing a candidate stops once it is over the budget, or, when the
	// request caps the whole prompt, over the cap: the edge does not
	// tokenize a conversation, so this count is the one that bounds a
	// hostile one. A prompt within the cap is within the budget too, or is
	// fitted from candidates that are shorter than it.
	maxPrompt := req.MaxPromptTokens
	limit := budget
	if maxPrompt > 0 {
		limit = maxPrompt
	}
	count := func(cand []parley.Message) (int, error) {
		if c, ok := seen[len(cand)]; ok {
			return len(c.tokens) + imageExtra(c.tokens, positions), nil
		}
		prompt, err := render(cand)
		if err != nil {
			return 0, err
		}
		cont := m != nil && strings.HasPrefix(prompt, m.prompt)
		if cont {
			if tokens, ok := m.extend(prompt, tk); ok {
				seen[len(cand)] = rendered{prompt, tokens, true}
				return len(tokens), nil
			}
		}
		// Over limit the count is only known to be over (the tokens
		// are a prefix): such a candidate is never the prompt.
		var tokens []int
		if hasImages {
			tokens, err = r.gen.(ImageTokenizer).TokenizeImages(prompt)
		} else {
			tokens, err = r.tokenize(ctx, prompt, limit)
		}
		if err != nil {
			return 0, fmt.Errorf("tokenize prompt: %w", err)
		}
		seen[len(cand)] = rendered{prompt, tokens, cont}
		return len(tokens) + imageExtra(tokens, positions), nil
	}
	if maxPrompt > 0 {
		// The whole conversation, as rendered, is held to the cap.
		n, err := count(msgs)
		if err != nil {
			return nil, fmt.Errorf("count prompt tokens: %w", err)
		}
		if n > maxPrompt {
			return nil, parley.PromptTooLong(n, maxPrompt, "the prompt is at least %d tokens with the template's markup; at most %d are accepted", n, maxPrompt)
		}
	}
	from := 0
	if m != nil {
		from = m.dropped
		if from > 0 {
			// Only a conversation that continues the memo's may skip its
			// dropped turns: check the candidate that keeps the most.
			cand := dropTurns(msgs, from)
			if _, err := count(cand); err != nil || !seen[len(cand)].cont {
				from, m = 0, nil
				clear(seen)
			}
		}
	}
	kept, dropped, turns, err := fit(msgs, budget, dropBlock, from, count)
	if parley.ErrorCode(err) == parley.ETooLarge {
		tokens, limit, _ := parley.PromptLimit(err)
		return nil, parley.PromptTooLong(tokens, limit, "%s (the context holds %d tokens, %d of them kept for the reply by max_tokens)",
			parley.ErrorMessage(err), info.ContextLength, p.MaxTokens)
	}
	if err != nil {
		return nil, fmt.Errorf("fit conversation: %w", err)
	}
	// Counted already, unless fit dropped more turns than any candidate it
	// counted.
	if _, err := count(kept); err != nil {
		return nil, fmt.Errorf("fit conversation: %w", err)
	}
	chosen := seen[len(kept)]
	if dropped > 0 {
		r.log.Info("dropped the oldest turns to fit the context",
			zap.String("key", key),
			zap.Int("dropped_messages", dropped),
			zap.Int("kept_messages", len(kept)),
			zap.Int("prompt_tokens", len(chosen.tokens)),
			zap.Int("budget_tokens", budget))
	}
	stops = append(append(stops, p.Stop...), tmpl.Stops()...)
	var remember func(gen []int, pieces []string, special []bool)
	if key != "" && tk != nil {
		// The memo for the next turn, stored when this reply ends (run).
		remember = func(gen []int, pieces []string, special []bool) {
			r.memos.put(key, &memo{msgs: len(msgs), dropped: turns, prompt: chosen.prompt, tokens: chosen.tokens, gen: gen, pieces: pieces, special: special})
		}
	}
	var images []parley.Image
	if hasImages {
		// The kept turns' images, in the order their markers stand in the prompt: the conversation's last ones.
		n, want := countImageTokens(chosen.tokens), parley.ImageCount(kept)
		if n != want || n > len(allImages) {
			return nil, parley.Errorf(parley.EInvalid, "the prompt holds %d image places for %d images (the chat template drops or repeats messages with images)", n, want)
		}
		images = allImages[len(allImages)-n:]
	}
	think := ThinkFormatOf(tmpl)
	return r.start(ctx, parley.GenerateRequest{Key: key, Scope: scope, Tokens: chosen.tokens, Params: p, Images: images, Client: req.Client, Stateless: req.Stateless}, chosen.prompt,
		stops, dropped, info.ContextLength, remember, think, planPhases(think, chosen.prompt, p, r.gen), ts)
}

// memoFor returns key's memo when msgs may continue its conversation (it
// has more messages than the memo's, and tk can extend its tokens), else nil.
// When msgs hold more than the one reply and one message a turn adds, turns
// may have been served elsewhere (another replica, whose state the shared
// KV tier holds): a saved state longer than the memo's conversation is
// taken instead, so the prompt continues the tokens that replica
// generated rather than this one's tokenization of their text.
func (r *Responder) memoFor(key string, msgs []parley.Message, tk ContinuationTokenizer) *memo {
	if key == "" || tk == nil {
		return nil
	}
	if m := r.memos.get(key); m != nil && len(msgs) > m.msgs {
		if len(msgs) > m.msgs+2 {
			if sm := r.savedMemo(key); sm != nil && len(sm.gen) > len(m.tokens)+len(m.gen) {
				return sm
			}
		}
		return m
	}
	return r.savedMemo(key)
}

// LimitTokenizer is a Generator that can stop tokenizing early (llm.Engine
// is one): with ctx's error once ctx ends, and, when limit > 0, once the
// text is known to need more than limit tokens, returning the tokens found
// so far (more than limit, the start of the text's) and no error.
type LimitTokenizer interface {
	TokenizeLimit(ctx context.Context, text string, limit int) ([]int, error)
}

// tokenize tokenizes a prompt, stopping early (see LimitTokenizer) when the
// generator can.
func (r *Responder) tokenize(ctx context.Context, prompt string, limit int) ([]int, error) {
	if lt, ok := r.gen.(LimitTokenizer); ok {
		return lt.TokenizeLimit(ctx, prompt, limit)
	}
	return r.gen.Tokenize(prompt)
}

// dropTurns returns msgs without their first k droppable turns (see fit).
func dropTurns(msgs []parley.Message, k int) []parley.Message {
	turnEnd := turnsOf(msgs)
	k = min(k, len(turnEnd))
	if k == 0 {
		return msgs
	}
	return withoutBefore(msgs, turnEnd[k-1])
}

// Complete is Reply for a raw prompt, req.Prompt: no template, no history
// to drop (a prompt that leaves no room for one token is ETooLarge), stop
// strings from p.Stop only. For clients that send the whole prompt (TGI inputs, plain
// ?prompt=). The same reading rule as Reply applies.
func (r *Responder) Complete(ctx context.Context, req parley.ReplyRequest) (parley.Reply, error) {
	rep, err := r.complete(ctx, req)
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// complete is Complete's work: req.Prompt is tokenized unless
// req.PromptTokens, its tokens, are given.
func (r *Responder) complete(ctx context.Context, req parley.ReplyRequest) (*Reply, error) {
	scope := req.CacheScope()
	key, prompt, tokens, p := parley.ScopedKey(scope, req.Key), req.Prompt, req.PromptTokens, req.Params
	info := r.gen.Info()
	if len(tokens) == 0 {
		var err error
		if tokens, err = r.tokenize(ctx, prompt, info.ContextLength); err != nil {
			return nil, fmt.Errorf("tokenize prompt: %w", err)
		}
	}
	if len(tokens)+1 > info.ContextLength {
		return nil, parley.PromptTooLong(len(tokens), info.ContextLength-1, "the prompt needs at least %d tokens, but the context holds %d including the reply", len(tokens), info.ContextLength)
	}
	return r.start(ctx, parley.GenerateRequest{Key: key, Scope: scope, Tokens: tokens, Params: p, Client: req.Client, Stateless: req.Stateless}, prompt, p.Stop, 0, info.ContextLength, nil, ThinkNone, nil, nil)
}

// start calls Generate with req (its Tokens are prompt's) and starts the
// goroutine that cleans its stream.
func (r *Responder) start(ctx context.Context, req parley.GenerateRequest, prompt string, stops []string, dropped, contextLength int,
	remember func(gen []int, pieces []string, special []bool), think ThinkFormat, plan *phasePlan, ts *toolStream) (*Reply, error) {
	tokens, p := req.Tokens, req.Params
	if len(tokens) == 0 {
		return nil, parley.Errorf(parley.EInvalid, "the prompt is empty")
	}
	// Room for every token the engine may send (the reply cap, or what is
	// left of the context) plus the final event, so that the goroutine does
	// not wait for its consumer; bounded by maxEventBuffer.
	size := contextLength - len(tokens)
	if p.MaxTokens > 0 && p.MaxTokens < size {
		size = p.MaxTokens
	}
	size = min(max(size, 0)+2, maxEventBuffer)
	// genCtx lets the reply stop generation on a stop string without
	// cancelling the caller's ctx.
	genCtx, cancel := context.WithCancel(ctx)
	var events <-chan parley.Event
	var err error
	if plan != nil {
		events, err = r.generatePhased(genCtx, req, plan, size)
	} else {
		events, err = r.gen.Generate(genCtx, req)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("generate: %w", err)
	}
	rep := &Reply{
		prompt:       prompt,
		promptTokens: len(tokens),
		dropped:      dropped,
		out:          make(chan parley.Event, size),
		done:         make(chan struct{}),
		remember:     remember,
		tools:        ts,
	}
	var split *thoughtSplit
	if think != ThinkNone {
		sp := NewSplitter(think, prompt)
		sp.calls = ts != nil
		split = &thoughtSplit{split: sp, st: NewStreamer(stops), format: think}
	}
	go rep.run(ctx, genCtx, cancel, events, NewStreamer(stops), split)
	return rep, nil
}

// Reply is one reply being generated, chat's parley.Reply. Its events are
// the engine's, cleaned: a token event's Token.Text is the text that became
// safe to show with that token (often the raw piece, sometimes "" while a
// partial character or a possible stop string is held back, sometimes more
// than the piece when held text is released); special tokens carry no text. The last event has Done
// set and carries the finish reason (FinishStop when a stop string ended the
// reply), usage and timings from the engine; then the channel is closed.
type Reply struct {
	prompt       string
	promptTokens int
	dropped      int
	out          chan parley.Event
	done         chan struct{} // closed when run has ended (see Done)
	// remember, when set, is called by run at the end with the tokens the
	// engine generated and their raw text, up to a stop.
	remember func(gen []int, pieces []string, special []bool)
	// tools splits tool calls from the text when the reply may make them.
	tools *toolStream

	mu        sync.Mutex
	text      strings.Builder // Token.Text of every delivered token event
	reasoning strings.Builder // Token.Reasoning of every delivered token event
	stop      string          // the stop string that ended the reply, set before the final event
}

// StopSequence returns the stop string (a Params.Stop entry or one of the
// template's) that ended the reply; "" unless the final event's finish
// reason is FinishStop. Read it after the final event.
func (rep *Reply) StopSequence() string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.stop
}

// Events returns the cleaned event stream.
func (rep *Reply) Events() <-chan parley.Event { return rep.out }

// Done is closed when the reply's goroutine has ended: its final event is
// in Events and the engine has ended its stream (or missed abandonAfter and
// is drained elsewhere). A model the reply runs on may be unloaded from then
// on, whether or not anyone reads Events.
func (rep *Reply) Done() <-chan struct{} { return rep.done }

// Prompt returns the rendered prompt (after fitting) that generation started from.
func (rep *Reply) Prompt() string { return rep.prompt }

// PromptTokens returns the number of tokens in the prompt.
func (rep *Reply) PromptTokens() int { return rep.promptTokens }

// Dropped returns how many of the oldest messages were left out to fit the context.
func (rep *Reply) Dropped() int { return rep.dropped }

// Text returns the concatenated text of the token events delivered so far;
// after the final event it is the whole cleaned reply.
func (rep *Reply) Text() string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.text.String()
}

// Reasoning returns the thought delivered so far (a reasoning model's, kept
// apart from Text); after the final event it is the whole thought.
func (rep *Reply) Reasoning() string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.reasoning.String()
}

// run is the one goroutine of a reply. It reads the engine's stream until
// the engine closes it, which Generate's contract guarantees after the final
// event; cancel is called when run ends. The contract also says that
// cancelling genCtx ends generation within one step, but a step is a call
// into llama.cpp that nothing can interrupt: when the engine has not ended
// the stream abandonAfter after genCtx ended, run ends the reply as
// cancelled with the text delivered so far and leaves the rest of the
// stream to a goroutine that drains it, so a stuck step cannot hold up the
// turn's commit or a shutdown.
//
// Holding back: when the Streamer holds text after a token, that token's
// event is kept back until the next event arrives, so that text released by
// Flush at the end can join the last token event rather than need an event
// of its own. Token events stay one per engine token.
func (rep *Reply) run(ctx, genCtx context.Context, cancel context.CancelFunc, in <-chan parley.Event, st *Streamer, split *thoughtSplit) {
	defer close(rep.done)
	defer close(rep.out)
	defer cancel()
	var (
		abandoned   bool // the engine missed abandonAfter; the stream is drained elsewhere
		final       parley.Event
		gotFinal    bool
		stopped     bool // a stop matched: later tokens are dropped and generation cancelled
		specialStop bool // the stop was a special token spelling a stop string
		pending     parley.Event
		hasPending  bool
		gen         []int
		pieces      []string
		special     []bool
	)
	src := &engineStream{in: in, ended: genCtx.Done()}
	defer src.stop()
	for {
		ev, ok := src.next()
		if !ok {
			abandoned = src.abandoned
			break
		}
		switch {
		case gotFinal:
			continue // nothing follows the final event; drain whatever does
		case ev.Done:
			final, gotFinal = ev, true
			continue
		case stopped:
			continue // decoded after the stop, before cancellation took effect
		}
		if hasPending {
			rep.deliver(ctx, pending)
			hasPending = false
		}
		if rep.remember != nil {
			gen, pieces, special = append(gen, ev.Token.ID), append(pieces, ev.Token.Text), append(special, ev.Token.Special)
		}
		ans := &answerPath{st: st, tools: rep.tools}
		ev.Token, stopped, specialStop = clean(ev.Token, st, split, ans)
		ev.ToolCall = ans.call
		switch {
		case stopped:
			rep.deliver(ctx, ev)
			cancel()
		case (st.holding() || split.holding() || rep.tools != nil && rep.tools.pending != "") && ev.ToolCall == nil:
			pending, hasPending = ev, true
		default:
			rep.deliver(ctx, ev)
		}
	}
	if split != nil && !stopped {
		// What the splitter holds at the end joins the last token event.
		if !hasPending {
			pending, hasPending = parley.Event{Token: parley.Token{ID: -1}}, true
		}
		ans := &answerPath{st: st, tools: rep.tools}
		pending.Token = split.flush(pending.Token, ans)
		if pending.ToolCall == nil {
			pending.ToolCall = ans.call
		}
	}
	if rep.tools != nil && !stopped {
		// Held text that was no call: content, as if it came now.
		t, stop := st.Push(rep.tools.Flush())
		if hasPending {
			pending.Token.Text += t
		} else if t != "" {
			rep.deliver(ctx, parley.Event{Token: parley.Token{ID: -1, Text: t}})
		}
		stopped = stopped || stop
	}
	if hasPending {
		pending.Token.Text += st.Flush()
		stopped = stopped || st.Stopped()
		if pending.Token.ID >= 0 || pending.Token.Text != "" || pending.Token.Reasoning != "" {
			rep.deliver(ctx, pending)
		}
	}
	if split != nil {
		final.Usage.ReasoningTokens = split.tokens
	}

	switch {
	case abandoned && !gotFinal:
		final = parley.Event{Finish: parley.FinishCancelled}
	case !gotFinal:
		final = parley.Event{Finish: parley.FinishError, Err: ErrNoFinalEvent}
	}
	final.Done = true
	final.Token.Text = ""
	if stopped && !(specialStop && final.Finish == parley.FinishEOS) {
		final.Finish, final.Err = parley.FinishStop, nil
		rep.mu.Lock()
		rep.stop = st.Matched()
		rep.mu.Unlock()
	}
	if rep.tools != nil {
		final = toolsFinal(final, rep.tools.Calls())
	}
	if rep.remember != nil && !abandoned {
		// Not when abandoned: the slot's cache may hold more than gen.
		// Before the final event: the next turn may start as soon as it is read.
		rep.remember(gen, pieces, special)
	}
	rep.deliverFinal(ctx, final)
}

// engineStream reads the engine's stream for Reply.run, giving up on it
// abandonAfter after ended (generation's context) is done.
type engineStream struct {
	in        <-chan parley.Event
	ended     <-chan struct{} // nil once seen
	timer     *time.Timer     // armed when ended is seen
	abandoned bool            // the engine missed abandonAfter; a goroutine drains in
}

// next returns the next event, or false when the stream is closed or abandoned.
func (s *engineStream) next() (parley.Event, bool) {
	var abandon <-chan time.Time
	for {
		if s.timer != nil {
			abandon = s.timer.C
		}
		select {
		case ev, ok := <-s.in:
			return ev, ok
		case <-s.ended:
			s.ended = nil
			s.timer = time.NewTimer(abandonAfter)
		case <-abandon:
			s.abandoned = true
			go func(in <-chan parley.Event) {
				for range in {
				}
			}(s.in)
			return parley.Event{}, false
		}
	}
}

func (s *engineStream) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

// deliver sends a token event unless the consumer has cancelled, and adds its
// text to Text when it was sent.
func (rep *Reply) deliver(ctx context.Context, ev parley.Event) {
	if ctx.Err() != nil {
		return
	}
	select {
	case rep.out <- ev:
		rep.mu.Lock()
		rep.text.WriteString(ev.Token.Text)
		rep.reasoning.WriteString(ev.Token.Reasoning)
		rep.mu.Unlock()
	case <-ctx.Done():
	}
}

// deliverFinal sends the final event without ever blocking for good: while
// the consumer is there it waits for room; once the consumer has cancelled
// (and may have stopped reading) it makes room by discarding the oldest
// unread token event. Normally the buffer is large enough that neither
// happens.
func (rep *Reply) deliverFinal(ctx context.Context, ev parley.Event) {
	for {
		select {
		case rep.out <- ev:
			return
		default:
		}
		if ctx.Err() == nil {
			select {
			case rep.out <- ev:
				return
			case <-ctx.Done():
			}
			continue
		}
		select {
		case <-rep.out:
		default:
		}
	}
}

// clean turns one engine token into what the reply shows: its text through
// the Streamer st (and a reasoning model's thought through split), stopped
// when a stop string matched, special when a control token spelled it.
func clean(tok parley.Token, st *Streamer, split *thoughtSplit, ans *answerPath) (out parley.Token, stopped, special bool) {
	switch {
	case split != nil && (!tok.Special || split.format.IsMarker(tok.Text)):
		// A reasoning model's text or thought marker: split, then each part
		// cleaned by its own Streamer (the answer's through ans).
		tok, stopped = split.push(tok, ans)
	case tok.Special && ans.tools != nil && !st.matchesStop(tok.Text) && ans.tools.wants(tok.Text):
		// A control token that opens or belongs to a tool call.
		tok.Text, stopped = ans.Push(tok.Text)
	case tok.Special:
		// Control tokens are not reply text. One that spells a stop string
		// (an end-of-turn marker the engine does not treat as
		// end-of-generation) ends the reply; what was held back is text.
		if !st.matchesStop(tok.Text) {
			tok.Text = ""
			return tok, false, false
		}
		tok.Text, stopped, special = st.Flush(), true, true
		if split != nil {
			tok = split.flush(tok, st)
		}
	default:
		tok.Text, stopped = ans.Push(tok.Text)
	}
	return tok, stopped, special
}

// textSink takes the answer's text and returns what is safe to show (a Streamer, or an answerPath in front of one).
type textSink interface {
	Push(text string) (emit string, stopped bool)
}

// answerPath is the way of an answer's text: tool calls split off first (when the reply may make them), then the
// answer's Streamer (stop strings, whole characters). call is the part of a call the pushed text carried.
type answerPath struct {
	st    *Streamer
	tools *toolStream
	call  *parley.ToolCallDelta
}

func (a *answerPath) Push(text string) (string, bool) {
	if a.tools != nil {
		var call *parley.ToolCallDelta
		text, call = a.tools.Push(text)
		if call != nil {
			a.call = call
		}
	}
	return a.st.Push(text)
}
