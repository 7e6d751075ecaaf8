package chat

import (
	"context"
	"strings"
	"time"
	"unicode"

	"github.com/parley-chat/parley"
)

// A reasoning reply in two phases, when the request constrains the answer (a grammar or JSON schema) or caps the
// thought (Params.ThinkBudget):
//
//  1. The thought, free: generated without the grammar, at most ThinkBudget tokens. It ends when the model writes
//     </think> (harmony: the final channel's header, <|channel|>final<|message|>); at the budget Parley writes
//     "\n</think>\n\n" (harmony: "<|end|><|start|>assistant<|channel|>final<|message|>") itself.
//  2. The answer: generation continues from the prompt plus the thought's exact tokens (the KV cache holds them, so
//     nothing is evaluated again), with the grammar, for what is left of MaxTokens.
//
// A <think> reply that opens no thought is generated with the grammar from its first token: the first tokens are
// held back until they show whether a thought opens (<think> after optional whitespace), and when none does,
// generation restarts from the prompt with the grammar. (A harmony reply always writes a header before its answer, so
// its first phase always runs to the final channel.)
//
// MaxTokens covers both phases (as OpenAI's max_completion_tokens covers reasoning tokens).

// thoughtSyntax is where a format's answer starts, and what Parley writes to end a thought at its budget.
type thoughtSyntax struct {
	answerStart string // the text after which the answer begins
	forced      string // written at the budget
	decides     bool   // the reply may open no thought (<think> tags); harmony always has a header
}

var (
	tagSyntax     = thoughtSyntax{answerStart: thinkClose, forced: "\n" + thinkClose + "\n\n", decides: true}
	channelSyntax = thoughtSyntax{answerStart: channelClose, forced: "\n" + channelClose, decides: true}
	harmonySyntax = thoughtSyntax{answerStart: harmonyChannel + "final" + harmonyMessage,
		forced: harmonyEnd + harmonyStart + "assistant" + harmonyChannel + "final" + harmonyMessage}
)

// phasePlan is a reply's two phases; nil when it needs one.
type phasePlan struct {
	syntax    thoughtSyntax
	open      string // a tag format's opening mark
	tk        ContinuationTokenizer
	opened    bool // the prompt opened the thought (it ends with <think>)
	budget    int  // > 0: the thought's cap in tokens
	grammared bool // the request constrains the answer
}

// planPhases returns the plan for a reply to prompt, or nil when one phase does (no thought in this format, thinking
// switched off by the template, nothing to constrain or cap, or no continuation tokenizer).
func planPhases(think ThinkFormat, prompt string, p parley.Params, gen Generator) *phasePlan {
	tk, ok := gen.(ContinuationTokenizer)
	grammared := p.Grammar != "" || len(p.JSONSchema) > 0
	if think == ThinkNone || !ok || (!grammared && p.ThinkBudget <= 0) {
		return nil
	}
	plan := &phasePlan{syntax: harmonySyntax, tk: tk, opened: true, budget: p.ThinkBudget, grammared: grammared}
	if open, close, ok := think.tags(); ok {
		tail := strings.TrimRightFunc(prompt, unicode.IsSpace)
		if strings.HasSuffix(tail, close) {
			return nil // thinking off: the template closed the thought
		}
		plan.syntax, plan.opened, plan.open = tagSyntax, strings.HasSuffix(tail, open), open
		if think == ThinkChannel {
			plan.syntax = channelSyntax
		}
	}
	return plan
}

// generatePhased starts the reply's engine stream: the events of both phases, as one stream with one final event.
func (r *Responder) generatePhased(ctx context.Context, req parley.GenerateRequest, plan *phasePlan, size int) (<-chan parley.Event, error) {
	p1 := req.Params
	p1.Grammar, p1.JSONSchema = "", nil
	if plan.budget > 0 && plan.budget < p1.MaxTokens {
		p1.MaxTokens = plan.budget
	}
	ctx1, cancel1 := context.WithCancel(ctx)
	ev1, err := r.gen.Generate(ctx1, parley.GenerateRequest{Key: req.Key, Scope: req.Scope, Tokens: req.Tokens, Params: p1, Images: req.Images, Client: req.Client, Stateless: req.Stateless})
	if err != nil {
		cancel1()
		return nil, err
	}
	out := make(chan parley.Event, size)
	ph := &phases{r: r, req: req, plan: plan, out: out, began: time.Now(), thinking: plan.opened, decided: plan.opened}
	go ph.run(ctx, ev1, cancel1, p1.MaxTokens)
	return out, nil
}

// phases is the goroutine state of one two-phase reply.
type phases struct {
	r        *Responder
	req      parley.GenerateRequest
	plan     *phasePlan
	out      chan<- parley.Event
	began    time.Time
	thinking bool   // inside the thought
	decided  bool   // known whether the reply opens a thought
	text     string // phase 1's text so far (to find the markers)
	gen      []int  // phase 1's tokens forwarded (and the forced close's)
	held     []parley.Event
}

func (ph *phases) run(ctx context.Context, ev1 <-chan parley.Event, cancel1 context.CancelFunc, cap1 int) {
	defer close(ph.out)
	defer cancel1()
	var final1 parley.Event
	ended := false // phase 1 ended by the model's </think>, or without a thought under a grammar
	restart := false
	for ev := range ev1 {
		if ev.Done {
			final1 = ev
			continue
		}
		if ended {
			continue // decoded after cancel1, before it took effect
		}
		ph.text += ev.Token.Text
		switch next := ph.step(ev); next {
		case stepEnd:
			ended = true
			cancel1()
		case stepRestart:
			ended, restart = true, true
			cancel1()
		}
	}
	switch {
	case ctx.Err() != nil:
		ph.finish(final1, parley.Event{Finish: parley.FinishCancelled})
		return
	case restart:
		ph.gen, ph.held = nil, nil // nothing was forwarded: answer from the prompt with the grammar
	case ended:
	case final1.Finish == parley.FinishLength && len(ph.gen)+len(ph.held) >= cap1 && cap1 < ph.req.Params.MaxTokens:
		ph.flushHeld()
		if ph.thinking && !ph.forceClose() {
			ph.finish(final1, parley.Event{Finish: parley.FinishError, Err: parley.Errorf(parley.EInternal, "close the thought at its budget")})
			return
		}
	default:
		ph.flushHeld()
		ph.finish(final1, parley.Event{}) // phase 1 was the whole reply (EOS, a stop, the cap, an error)
		return
	}
	ph.answer(ctx, final1)
}

type stepResult int

const (
	stepOn stepResult = iota
	stepEnd
	stepRestart
)

// step forwards (or holds) one phase-1 token and says whether phase 1 ends.
func (ph *phases) step(ev parley.Event) stepResult {
	if !ph.decided && !ph.thinking {
		rest := strings.TrimLeftFunc(ph.text, unicode.IsSpace)
		switch {
		case strings.HasPrefix(rest, ph.plan.open):
			ph.decided, ph.thinking = true, true
		case strings.HasPrefix(ph.plan.open, rest):
			ph.held = append(ph.held, ev) // maybe the open tag, still arriving
			return stepOn
		default:
			ph.decided = true
			if ph.plan.grammared {
				return stepRestart // no thought: the answer is constrained from its first token
			}
		}
		ph.flushHeld()
	}
	ph.decided = true
	ph.send(ev)
	if ph.thinking && strings.Contains(ph.text, ph.plan.syntax.answerStart) {
		ph.thinking = false
		return stepEnd
	}
	return stepOn
}

func (ph *phases) send(ev parley.Event) {
	ph.gen = append(ph.gen, ev.Token.ID)
	ph.out <- ev
}

func (ph *phases) flushHeld() {
	for _, ev := range ph.held {
		ph.send(ev)
	}
	ph.held = nil
}

// forceClose writes the end of the thought as tokens of their own (the first carries the text).
func (ph *phases) forceClose() bool {
	forced := ph.plan.syntax.forced
	toks, err := ph.plan.tk.TokenizeContinuation(forced)
	if err != nil || len(toks) == 0 {
		return false
	}
	for i, id := range toks {
		ev := parley.Event{Token: parley.Token{ID: id}}
		if i == 0 {
			ev.Token.Text = forced
		}
		ph.send(ev)
	}
	ph.thinking = false
	return true
}

// answer runs phase 2 from the prompt plus phase 1's tokens, with the request's own parameters.
func (ph *phases) answer(ctx context.Context, final1 parley.Event) {
	p2 := ph.req.Params
	p2.MaxTokens -= len(ph.gen)
	if p2.MaxTokens <= 0 {
		ph.finish(final1, parley.Event{Finish: parley.FinishLength})
		return
	}
	tokens := append(append([]int(nil), ph.req.Tokens...), ph.gen...)
	ev2, err := ph.r.gen.Generate(ctx, parley.GenerateRequest{Key: ph.req.Key, Scope: ph.req.Scope, Tokens: tokens, Params: p2, Images: ph.req.Images, Client: ph.req.Client, Stateless: ph.req.Stateless})
	if err != nil {
		ph.finish(final1, parley.Event{Finish: parley.FinishError, Err: err})
		return
	}
	var final2 parley.Event
	for ev := range ev2 {
		if ev.Done {
			final2 = ev
			continue
		}
		ph.out <- ev
	}
	final2.Usage.CompletionTokens += len(ph.gen)
	final2.Usage.PromptTokens, final2.Usage.CachedPromptTokens = final1.Usage.PromptTokens, final1.Usage.CachedPromptTokens
	final2.Timings.TimeToFirstToken, final2.Timings.Queued = final1.Timings.TimeToFirstToken, final1.Timings.Queued
	final2.Timings.Total = time.Since(ph.began)
	ph.out <- final2
}

// finish sends the final event: phase 1's, with over's finish reason and error when over sets one.
func (ph *phases) finish(final1, over parley.Event) {
	ev := final1
	if !final1.Done && over.Finish == "" {
		over = parley.Event{Finish: parley.FinishError, Err: ErrNoFinalEvent}
	}
	ev.Done = true
	if over.Finish != "" {
		ev.Finish, ev.Err = over.Finish, over.Err
	}
	ev.Usage.CompletionTokens = len(ph.gen)
	if ev.Timings.Total == 0 {
		ev.Timings.Total = time.Since(ph.began)
	}
	ph.out <- ev
}
