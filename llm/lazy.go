package llm

import (
	"strings"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// lazyGrammar is a grammar that is not applied from the first token: a
// reply with tool_choice auto samples freely until its text reaches the
// trigger (the template's tool-call tag), and from the next token the
// grammar, which starts right after the trigger, forces a valid call. The
// binding has no lazy grammar of its own; this is one on the engine's
// grammar sampler: it is compiled and probed when the request arrives (so a
// bad tool grammar is refused at once), then waits unused until the trigger.
type lazyGrammar struct {
	gs      *grammarSampler
	trigger string
	tail    string // the end of the reply's text, up to len(trigger) bytes
}

// newLazy returns seq's lazy grammar, or nil when p has none. inline says
// the sequence samples without a grammar first (a grammar from the first
// token leaves no room for a lazy one).
func (e *Engine) newLazy(p parley.Params, client string, inline bool) (*lazyGrammar, error) {
	trigger, grammar, ok := p.LazyToolGrammar()
	if !ok || !inline {
		return nil, nil
	}
	cg, err := e.compileGrammar(grammar, e.samplerParams(p))
	if err != nil {
		return nil, parley.FieldErrorf("tools", "%v", err)
	}
	gs, err := e.startSampler(cg, "tools", client)
	if err != nil {
		return nil, err
	}
	if err := e.probe(gs); err != nil {
		e.stopSampler(gs)
		return nil, err
	}
	return &lazyGrammar{gs: gs, trigger: trigger}, nil
}

// watchTrigger follows seq's text (one token's piece at a time) and hands
// sampling to the lazy grammar once the text ends with its trigger. A token
// that writes past the trigger (the trigger inside a longer piece) does not
// start it: the call grammar could not follow a piece it did not see, and
// the text is then free, as a model writes without tools.
func (e *Engine) watchTrigger(seq *sequence, piece string) {
	lz := seq.lazy
	lz.tail += piece
	if len(lz.tail) > len(lz.trigger) {
		lz.tail = lz.tail[len(lz.tail)-len(lz.trigger):]
	}
	if !strings.HasSuffix(lz.tail, lz.trigger) {
		return
	}
	e.log.Debug("tool call trigger: constraining the call", zap.String("key", seq.req.Key), zap.Int("generated", seq.generated))
	seq.gs, seq.lazy = lz.gs, nil
}
