package chat

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode"

	"github.com/parley-chat/parley"
)

// Template renders a conversation in one chat-template family's format.
type Template interface {
	// Name is the family's canonical name, as TemplateByName accepts it.
	Name() string
	// Render returns the prompt for msgs. With opt.AddGenerationPrompt the
	// prompt ends with the header that opens the assistant's turn (families
	// whose format has none ignore it). BOS is never rendered: the tokenizer
	// adds it. Invariant, relied on for KV-cache reuse: for a conversation c
	// that ends with a user message, Render(c, gen) is a prefix of
	// Render(c + assistant + user, gen) with gen = RenderOptions{AddGenerationPrompt: true}.
	Render(msgs []parley.Message, opt RenderOptions) (string, error)
	// Stops are the family's end-of-turn strings: text that must also end a
	// reply when the model spells it out instead of sampling an
	// end-of-generation token. The caller owns the returned slice.
	Stops() []string
}

// RenderOptions are the variables a chat template is rendered with besides the messages, as Hugging Face passes
// them: add_generation_prompt, tools, enable_thinking.
type RenderOptions struct {
	AddGenerationPrompt bool
	// Tools are the functions the model may call; nil renders no tool prompt.
	Tools []parley.Tool
	// Thinking switches a reasoning model's thought on or off (enable_thinking); nil leaves the template's default.
	Thinking *bool
}

// Gen is the options of a plain generation prompt: the assistant's turn opened, no tools, the template's default
// thinking.
var Gen = RenderOptions{AddGenerationPrompt: true}

// ErrUnknownTemplate is returned (wrapped) by TemplateByName.
var ErrUnknownTemplate = errors.New("unknown chat template")

// Canonical family names.
const (
	NameChatML  = "chatml"
	NameLlama3  = "llama3"
	NameLlama2  = "llama2"
	NameMistral = "mistral"
	NameGemma   = "gemma"
	NamePhi3    = "phi3"
	NamePhi4    = "phi4"
	NameZephyr  = "zephyr"
	NamePlain   = "plain"
)

// Zephyr's end-of-turn marker is the model's EOS token; these are the two
// spellings its templates use.
const (
	zephyrEOSDefault = "</s>"          // HuggingFaceH4/zephyr, TinyLlama-Chat
	zephyrEOSStable  = "<|endoftext|>" // stablelm-zephyr
)

// canonicalName maps an accepted name (canonical or alias, any case) to its
// canonical family name, or "" when there is none.
func canonicalName(name string) string {
	switch n := strings.ToLower(strings.TrimSpace(name)); n {
	case NameChatML, NameLlama3, NameLlama2, NameMistral, NameGemma, NamePhi3, NamePhi4, NameZephyr, NamePlain:
		return n
	case "llama-3":
		return NameLlama3
	case "llama-2":
		return NameLlama2
	case "gemma2", "gemma3":
		return NameGemma
	case "phi-3":
		return NamePhi3
	case "phi-4":
		return NamePhi4
	}
	return ""
}

// TemplateNames lists the canonical family names, sorted.
func TemplateNames() []string {
	names := []string{NameChatML, NameLlama3, NameLlama2, NameMistral, NameGemma, NamePhi3, NamePhi4, NameZephyr, NamePlain}
	sort.Strings(names)
	return names
}

// TemplateByName returns the family called name (a canonical name or an
// alias such as "llama-3"), for a flag that overrides detection.
func TemplateByName(name string) (Template, error) {
	switch canonicalName(name) {
	case NameChatML:
		return chatML(), nil
	case NameLlama3:
		return llama3(), nil
	case NameLlama2:
		return llama2(), nil
	case NameMistral:
		return mistral(), nil
	case NameGemma:
		return gemma(), nil
	case NamePhi3:
		return phi3(), nil
	case NamePhi4:
		return phi4(), nil
	case NameZephyr:
		return zephyr(zephyrEOSDefault), nil
	case NamePlain:
		return plain(), nil
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownTemplate, name, strings.Join(TemplateNames(), ", "))
}

// DetectTemplate recognises the family of a GGUF tokenizer.chat_template
// (Jinja source) by the substrings its format needs, in the order
// llama.cpp's llm_chat_detect_template tries them, so that a template both
// would claim is claimed by the same family. A family name is accepted as
// well. "" or an unrecognised template yields the plain transcript.
func DetectTemplate(jinja string) Template {
	if canonicalName(jinja) != "" {
		t, _ := TemplateByName(jinja) // cannot fail for a canonical name
		return t
	}
	has := func(s string) bool { return strings.Contains(jinja, s) }
	switch {
	case has("<|im_start|>"):
		if has("<|im_sep|>") {
			return phi4()
		}
		if has("<end_of_utterance>") {
			// SmolVLM uses <|im_start|> as BOS but is not ChatML.
			return plain()
		}
		return chatML()
	case strings.HasPrefix(jinja, "mistral") || has("[INST]"):
		if has("<<SYS>>") {
			return llama2()
		}
		return mistral()
	case has("<|assistant|>") && has("<|end|>"):
		return phi3()
	case has("[gMASK]"):
		// ChatGLM uses <|user|>/<|assistant|> too, in a format of its own.
		return plain()
	case has("<|user|>") && has("<|endoftext|>"):
		return zephyr(zephyrEOSStable)
	case has("<|user|>") && has("<|assistant|>") && (has("eos_token") || has(zephyrEOSDefault)):
		// HuggingFaceH4/zephyr and TinyLlama-Chat write eos_token after
		// every turn. llama.cpp names this shape falcon3/glmedge; Falcon 3
		// omits the EOS after user turns, a small difference its models
		// tolerate.
		return zephyr(zephyrEOSDefault)
	case has("<start_of_turn>"):
		return gemma()
	case has("<|start_header_id|>") && has("<|end_header_id|>"):
		return llama3()
	}
	return plain()
}

// family is a Template defined by a render function.
type family struct {
	name   string
	stops  []string
	render func(b *strings.Builder, msgs []parley.Message, addGenerationPrompt bool)
}

func (f *family) Name() string { return f.name }

func (f *family) Stops() []string { return append([]string(nil), f.stops...) }

func (f *family) Render(msgs []parley.Message, opt RenderOptions) (string, error) {
	if usesTools(msgs, opt) {
		return f.renderTools(msgs, opt) // tools.go
	}
	for _, m := range msgs {
		switch m.Role {
		case parley.RoleSystem, parley.RoleUser, parley.RoleAssistant:
		default:
			return "", parley.FieldErrorf("role", "must be system, user or assistant, got %q", m.Role)
		}
	}
	var b strings.Builder
	f.render(&b, msgs, opt.AddGenerationPrompt)
	return b.String(), nil
}

// pyStrip trims like Python's str.strip(), which Jinja's trim filter and the
// templates' .strip() calls use: Unicode White_Space plus the ASCII
// separators U+001C..U+001F, which Go's unicode.IsSpace does not count.
func pyStrip(s string) string {
	return strings.TrimFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
	})
}

// systemText joins the contents of every system message for families that
// have no system role of their own and fold it into a turn. The official
// templates only look at messages[0]; joining keeps a later system message
// from vanishing.
func systemText(msgs []parley.Message) (string, bool) {
	var parts []string
	for _, m := range msgs {
		if m.Role == parley.RoleSystem {
			parts = append(parts, m.Content)
		}
	}
	return strings.Join(parts, "\n\n"), len(parts) > 0
}

// chatML: <|im_start|>role\ncontent<|im_end|>\n (OpenHermes, Qwen, SmolLM, ...).
func chatML() Template {
	return &family{name: NameChatML, stops: []string{"<|im_end|>"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			for _, m := range msgs {
				b.WriteString("<|im_start|>" + string(m.Role) + "\n" + m.Content + "<|im_end|>\n")
			}
			if gen {
				b.WriteString("<|im_start|>assistant\n")
			}
		}}
}

// phi4: ChatML with <|im_sep|> after the role and no newlines.
func phi4() Template {
	return &family{name: NamePhi4, stops: []string{"<|im_end|>"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			for _, m := range msgs {
				b.WriteString("<|im_start|>" + string(m.Role) + "<|im_sep|>" + m.Content + "<|im_end|>")
			}
			if gen {
				b.WriteString("<|im_start|>assistant<|im_sep|>")
			}
		}}
}

// llama3: Meta Llama 3 Instruct. Contents are trimmed, as the official
// template does. (Llama 3.1's template also prepends a "Cutting Knowledge
// Date" system header; like llama.cpp's built-in renderer, this one does not.)
func llama3() Template {
	return &family{name: NameLlama3, stops: []string{"<|eot_id|>"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			for _, m := range msgs {
				b.WriteString("<|start_header_id|>" + string(m.Role) + "<|end_header_id|>\n\n" + pyStrip(m.Content) + "<|eot_id|>")
			}
			if gen {
				b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
			}
		}}
}

// llama2: Llama 2 Chat. The system prompt goes into the first turn inside
// <<SYS>> markers; every user turn after the first starts with a literal <s>
// (the first one's BOS comes from the tokenizer); the assistant's reply is
// framed by spaces and closed with </s>. There is no generation prompt: the
// prompt ends with [/INST].
func llama2() Template {
	return &family{name: NameLlama2, stops: []string{"</s>"},
		render: func(b *strings.Builder, msgs []parley.Message, _ bool) {
			sys, hasSys := systemText(msgs)
			first := true
			for _, m := range msgs {
				if m.Role == parley.RoleSystem {
					continue
				}
				content := m.Content
				if first && hasSys {
					content = "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + content
				}
				first = false
				if m.Role == parley.RoleUser {
					if b.Len() > 0 {
						b.WriteString("<s>")
					}
					b.WriteString("[INST] " + pyStrip(content) + " [/INST]")
				} else {
					b.WriteString(" " + pyStrip(content) + " </s>")
				}
			}
		}}
}

// mistral: Mistral Instruct v0.1/v0.2: [INST] user [/INST]reply</s>. Its
// template has no system role; the system prompt is folded into the first
// user turn followed by a blank line, as Mistral's later templates and
// llama.cpp do (the first turn, not the last, so the prompt prefix stays
// stable across turns).
func mistral() Template {
	return &family{name: NameMistral, stops: []string{"</s>"},
		render: func(b *strings.Builder, msgs []parley.Message, _ bool) {
			sys, hasSys := systemText(msgs)
			for _, m := range msgs {
				switch m.Role {
				case parley.RoleUser:
					content := m.Content
					if hasSys {
						content = sys + "\n\n" + content
						hasSys = false
					}
					b.WriteString("[INST] " + content + " [/INST]")
				case parley.RoleAssistant:
					b.WriteString(m.Content + "</s>")
				}
			}
		}}
}

// gemma: Gemma (1, 2, 3) Instruct. The assistant is called "model"; contents
// are trimmed; there is no system role, so the system prompt and a blank line
// open the first turn, exactly as Gemma 3's template does.
func gemma() Template {
	return &family{name: NameGemma, stops: []string{"<end_of_turn>"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			sys, hasSys := systemText(msgs)
			prefix := ""
			if hasSys {
				prefix = sys + "\n\n"
			}
			for _, m := range msgs {
				role := string(m.Role)
				switch m.Role {
				case parley.RoleSystem:
					continue
				case parley.RoleAssistant:
					role = "model"
				}
				b.WriteString("<start_of_turn>" + role + "\n" + prefix + pyStrip(m.Content) + "<end_of_turn>\n")
				prefix = ""
			}
			if gen {
				b.WriteString("<start_of_turn>model\n")
			}
		}}
}

// phi3: Phi-3 Instruct: <|role|>\ncontent<|end|>\n. The official template
// appends its EOS when there is no generation prompt; this one never renders
// an end-of-sequence marker, which keeps a rendered history a prefix of the
// next turn's prompt.
func phi3() Template {
	return &family{name: NamePhi3, stops: []string{"<|end|>", "<|endoftext|>"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			for _, m := range msgs {
				b.WriteString("<|" + string(m.Role) + "|>\n" + m.Content + "<|end|>\n")
			}
			if gen {
				b.WriteString("<|assistant|>\n")
			}
		}}
}

// zephyr: <|role|>\ncontent{eos}\n, where eos is the model's EOS text.
func zephyr(eos string) Template {
	return &family{name: NameZephyr, stops: []string{eos, "<|user|>"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			for _, m := range msgs {
				b.WriteString("<|" + string(m.Role) + "|>\n" + m.Content + eos + "\n")
			}
			if gen {
				b.WriteString("<|assistant|>\n")
			}
		}}
}

// plain is the transcript for models without a chat template (stories260K
// and other base models): "Role: content" paragraphs, ending with
// "Assistant:" when a reply is wanted. The generation prompt has no trailing
// space, so SentencePiece tokenizers can start the reply with their usual
// space-prefixed word. "\nUser:" is a stop so the model cannot speak for the
// user.
func plain() Template {
	return &family{name: NamePlain, stops: []string{"\nUser:", "\nSystem:"},
		render: func(b *strings.Builder, msgs []parley.Message, gen bool) {
			for _, m := range msgs {
				if b.Len() > 0 {
					b.WriteString("\n\n")
				}
				label := "User:"
				switch m.Role {
				case parley.RoleSystem:
					label = "System:"
				case parley.RoleAssistant:
					label = "Assistant:"
				}
				b.WriteString(label + " " + pyStrip(m.Content))
			}
			if gen {
				if b.Len() > 0 {
					b.WriteString("\n\n")
				}
				b.WriteString("Assistant:")
			}
		}}
}
