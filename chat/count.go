package chat

import (
	"fmt"

	"github.com/parley-chat/parley"
)

// CountTokens returns how many tokens the prompt for msgs holds, rendered
// and tokenized as Reply renders and tokenizes it for key with p (its
// thinking switch and tools), from the exact tokens of key's last turn when msgs
// continue it, without generating. The whole conversation is counted: turns
// Reply would drop to fit the context are not dropped. For Anthropic's
// count_tokens.
func (r *Responder) CountTokens(key string, msgs []parley.Message, p parley.Params) (int, error) {
	if len(msgs) == 0 {
		return 0, parley.FieldErrorf("messages", "at least one message is needed")
	}
	info := r.gen.Info()
	tmpl := r.Template()
	opt, _, _, err := toolSetup(tmpl, &p)
	if err != nil {
		return 0, err
	}
	opt.Tools = neutralizeTools(opt.Tools, info.ControlTokens)
	prompt, err := tmpl.Render(neutralize(msgs, info.ControlTokens), opt)
	if err != nil {
		return 0, err
	}
	tk, _ := r.gen.(ContinuationTokenizer)
	if m := r.memoFor(key, msgs, tk); m != nil && m.dropped == 0 {
		if tokens, ok := m.extend(prompt, tk); ok {
			return len(tokens), nil
		}
	}
	tokens, err := r.gen.Tokenize(prompt)
	if err != nil {
		return 0, fmt.Errorf("tokenize prompt: %w", err)
	}
	return len(tokens), nil
}
