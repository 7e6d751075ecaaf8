package synth

// Ready-made scripts for tests of reasoning and chat templates. Each returns a fresh value: change it freely.

// ChatMLThinking is a Qwen3-style model: ChatML turns, a thought in <think> tags, then the answer and <|im_end|>.
// The template is a minimal ChatML one; set Template to a real model's for template tests.
func ChatMLThinking() *Script {
	return &Script{
		Template: "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
			"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
		Control: []string{"<|im_start|>", "<|im_end|>"},
		Text:    []string{"<think>", "</think>"},
		After:   "\n",
		Reply:   "<think>The user says hi. I should greet them.</think>Hello there, how are you today?<|im_end|>",
	}
}

// Harmony is a gpt-oss-style model: the prompt ends with <|start|>, and the reply is the analysis channel, then the
// final channel, then <|return|>. With <|return|> and <|call|> both in the vocabulary llama.cpp does not end a reply
// on <|end|>, as for gpt-oss. The reply repeats <|channel|>, <|message|> and "assistant", which the second time are
// spelled in ordinary pieces (same text, other tokens). No template: set one for template tests.
func Harmony() *Script {
	return &Script{
		Control: []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"},
		After:   "<|start|>",
		Reply: "assistant<|channel|>analysis<|message|>Think about it.<|end|><|start|>assistant<|channel|>final" +
			"<|message|>Blue is the answer.<|return|>",
	}
}

// ToolCaller is a Hermes-style model for tests of tools that run on the server: after a user's message it calls
// add(2, 40) in <tool_call> tags, and after a tool's result (its template ends that prompt with <|answer|>) it
// answers "The server worked it out.".
func ToolCaller() *Script {
	return &Script{
		Template: "{% if tools %}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
			"{% if add_generation_prompt %}{% if messages[-1].role == 'tool' %}<|im_start|>assistant<|answer|>" +
			"{% else %}<|im_start|>assistant\n{% endif %}{% endif %}",
		Control: []string{"<|im_start|>", "<|im_end|>", "<|answer|>"},
		Text:    []string{"<tool_call>", "</tool_call>"},
		After:   "\n",
		Reply:   `<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>`,
		End:     "<|im_end|>",
		Then:    []Branch{{After: "<|answer|>", Reply: "The server worked it out."}},
	}
}
