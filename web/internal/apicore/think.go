package apicore

import "github.com/parley-chat/parley"

// thinkPatch is how the wires switch a reasoning model's thought on or off: OpenAI's reasoning_effort ("none" is
// off, any effort on), Ollama's think, and enable_thinking, top-level or in chat_template_kwargs as llama.cpp and
// vLLM take it. The last one given in that order wins; none leaves the model's default (see parley.Params.Think).
type thinkPatch struct {
	ReasoningEffort    *string `json:"reasoning_effort"`
	Think              *bool   `json:"think"`
	EnableThinking     *bool   `json:"enable_thinking"`
	ChatTemplateKwargs *struct {
		EnableThinking *bool `json:"enable_thinking"`
	} `json:"chat_template_kwargs"`
	// ThinkBudget caps the thought in tokens (reasoning_budget: llama.cpp's name); see parley.Params.ThinkBudget.
	ThinkBudget     *int `json:"think_budget"`
	ReasoningBudget *int `json:"reasoning_budget"`
}

// budget returns the thought's cap the request set, or nil.
func (p *thinkPatch) budget() *int {
	if p.ThinkBudget != nil {
		return p.ThinkBudget
	}
	return p.ReasoningBudget
}

// think returns the thought switch the request asked for, nil for none.
func (p *thinkPatch) think() (*bool, error) {
	var on *bool
	if p.ReasoningEffort != nil {
		v, err := effortThinks(*p.ReasoningEffort, "reasoning_effort")
		if err != nil {
			return nil, err
		}
		on = &v
	}
	for _, v := range []*bool{p.Think, p.EnableThinking} {
		if v != nil {
			on = v
		}
	}
	if k := p.ChatTemplateKwargs; k != nil && k.EnableThinking != nil {
		on = k.EnableThinking
	}
	return on, nil
}

// effortThinks maps a reasoning effort (OpenAI's values) to the thought switch: "none" is off, any effort on.
func effortThinks(effort, field string) (bool, error) {
	switch effort {
	case "none":
		return false, nil
	case "minimal", "low", "medium", "high", "xhigh":
		return true, nil
	}
	return false, parley.FieldErrorf(field, "must be none, minimal, low, medium or high, got %q", effort)
}

// AssistantReasoning is the thought an input message carries: an assistant's only (a thought in another role's
// message is not history).
func AssistantReasoning(role parley.Role, thought string) string {
	if role != parley.RoleAssistant {
		return ""
	}
	return thought
}
