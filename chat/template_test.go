package chat_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

func sys(s string) parley.Message  { return parley.Message{Role: parley.RoleSystem, Content: s} }
func user(s string) parley.Message { return parley.Message{Role: parley.RoleUser, Content: s} }
func asst(s string) parley.Message { return parley.Message{Role: parley.RoleAssistant, Content: s} }

func mustTemplate(t testing.TB, name string) chat.Template {
	t.Helper()
	tmpl, err := chat.TemplateByName(name)
	if err != nil {
		t.Fatalf("TemplateByName(%q): %v", name, err)
	}
	return tmpl
}

// TestRenderGolden compares Render with what the real Hugging Face templates
// render through Jinja2 (testdata/golden.py wrote golden.json; it records
// the few deliberate differences).
func TestRenderGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var golden struct {
		Conversations map[string][][2]string `json:"conversations"`
		Cases         []struct {
			Family              string `json:"family"`
			Template            int    `json:"template"`
			Conversation        string `json:"conversation"`
			AddGenerationPrompt bool   `json:"add_generation_prompt"`
			Want                string `json:"want"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden.Cases) < 50 {
		t.Fatalf("golden.json has %d cases; regenerate it with testdata/golden.py", len(golden.Cases))
	}
	families := map[string]bool{}
	for _, c := range golden.Cases {
		families[c.Family] = true
		var msgs []parley.Message
		for _, m := range golden.Conversations[c.Conversation] {
			msgs = append(msgs, parley.Message{Role: parley.Role(m[0]), Content: m[1]})
		}
		got, err := mustTemplate(t, c.Family).Render(msgs, chat.RenderOptions{AddGenerationPrompt: c.AddGenerationPrompt})
		if err != nil {
			t.Errorf("%s/%d/%s: %v", c.Family, c.Template, c.Conversation, err)
			continue
		}
		if got != c.Want {
			t.Errorf("%s (template %d) %s gen=%v:\n got %q\nwant %q", c.Family, c.Template, c.Conversation, c.AddGenerationPrompt, got, c.Want)
		}
	}
	for _, f := range []string{"chatml", "llama3", "llama2", "mistral", "gemma", "phi3", "zephyr"} {
		if !families[f] {
			t.Errorf("no golden case for %s", f)
		}
	}
}

// TestRender spells out every family's format, including the cases no
// official template defines (system prompts for Mistral, Phi-4, plain).
func TestRender(t *testing.T) {
	single := []parley.Message{user("Hi")}
	withSys := []parley.Message{sys("Be brief."), user("Hi")}
	multi := []parley.Message{sys("Be brief."), user("Hi"), asst("Hello!"), user("Bye?")}
	tests := []struct {
		family string
		msgs   []parley.Message
		gen    bool
		want   string
	}{
		{"chatml", single, true, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{"chatml", withSys, false, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"},
		{"chatml", multi, true, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye?<|im_end|>\n<|im_start|>assistant\n"},

		{"llama3", single, true, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama3", multi, true, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},

		{"llama2", single, true, "[INST] Hi [/INST]"},
		{"llama2", withSys, true, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"},
		{"llama2", multi, true, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye? [/INST]"},
		{"llama2", []parley.Message{sys("A"), user("Hi"), sys("B")}, true, "[INST] <<SYS>>\nA\n\nB\n<</SYS>>\n\nHi [/INST]"},

		{"mistral", single, true, "[INST] Hi [/INST]"},
		{"mistral", withSys, true, "[INST] Be brief.\n\nHi [/INST]"},
		{"mistral", multi, true, "[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye? [/INST]"},

		{"gemma", single, true, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"},
		{"gemma", withSys, true, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"},
		{"gemma", multi, false, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye?<end_of_turn>\n"},

		{"phi3", withSys, true, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"},
		{"phi3", multi, true, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye?<|end|>\n<|assistant|>\n"},

		{"phi4", single, true, "<|im_start|>user<|im_sep|>Hi<|im_end|><|im_start|>assistant<|im_sep|>"},
		{"phi4", withSys, true, "<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|><|im_start|>assistant<|im_sep|>"},

		{"zephyr", withSys, true, "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"},
		{"zephyr", multi, true, "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n<|user|>\nBye?</s>\n<|assistant|>\n"},

		{"plain", single, true, "User: Hi\n\nAssistant:"},
		{"plain", single, false, "User: Hi"},
		{"plain", withSys, true, "System: Be brief.\n\nUser: Hi\n\nAssistant:"},
		{"plain", multi, true, "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Bye?\n\nAssistant:"},
		{"plain", []parley.Message{user("  padded\n"), asst(" Once upon a time.\n")}, false, "User: padded\n\nAssistant: Once upon a time."},
		{"plain", nil, true, "Assistant:"},
	}
	for _, tt := range tests {
		got, err := mustTemplate(t, tt.family).Render(tt.msgs, chat.RenderOptions{AddGenerationPrompt: tt.gen})
		if err != nil {
			t.Errorf("%s: %v", tt.family, err)
			continue
		}
		if got != tt.want {
			t.Errorf("%s %v gen=%v:\n got %q\nwant %q", tt.family, tt.msgs, tt.gen, got, tt.want)
		}
	}
}

// TestRenderPrefixStable checks the invariant KV-cache reuse depends on: the
// prompt of one turn, followed by the reply, is where the next prompt starts.
func TestRenderPrefixStable(t *testing.T) {
	convs := [][]parley.Message{
		{user("Hi")},
		{sys("Be brief."), user("Hi")},
		{sys("Be brief."), user("Hi"), asst("Hello"), user("How are you?")},
		{asst("Greetings."), user("Hi")},
	}
	for _, name := range chat.TemplateNames() {
		tmpl := mustTemplate(t, name)
		for _, c := range convs {
			before, err := tmpl.Render(c, chat.Gen)
			if err != nil {
				t.Fatal(err)
			}
			after, err := tmpl.Render(append(slices.Clone(c), asst("Fine."), user("Good.")), chat.Gen)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(after, before) {
				t.Errorf("%s: next turn's prompt does not start with this turn's:\n this %q\n next %q", name, before, after)
			}
		}
	}
}

func TestRenderRejectsUnknownRole(t *testing.T) {
	for _, name := range chat.TemplateNames() {
		_, err := mustTemplate(t, name).Render([]parley.Message{{Role: "function", Content: "x"}}, chat.Gen)
		if parley.ErrorCode(err) != parley.EInvalid {
			t.Errorf("%s: Render with role function: got %v, want an EInvalid error", name, err)
		}
	}
}

func TestTemplateByName(t *testing.T) {
	tests := []struct {
		name, want string
	}{
		{"chatml", "chatml"},
		{"ChatML", "chatml"},
		{"llama-3", "llama3"},
		{"llama3", "llama3"},
		{"llama-2", "llama2"},
		{"mistral", "mistral"},
		{"gemma3", "gemma"},
		{"phi-3", "phi3"},
		{"phi4", "phi4"},
		{"zephyr", "zephyr"},
		{" plain ", "plain"},
	}
	for _, tt := range tests {
		if got := mustTemplate(t, tt.name).Name(); got != tt.want {
			t.Errorf("TemplateByName(%q).Name() = %q, want %q", tt.name, got, tt.want)
		}
	}
	for _, bad := range []string{"", "vicuna", "auto"} {
		if _, err := chat.TemplateByName(bad); !errors.Is(err, chat.ErrUnknownTemplate) {
			t.Errorf("TemplateByName(%q): got %v, want ErrUnknownTemplate", bad, err)
		}
	}
	for _, name := range chat.TemplateNames() {
		if got := mustTemplate(t, name).Name(); got != name {
			t.Errorf("TemplateByName(%q).Name() = %q", name, got)
		}
	}
}

func TestStops(t *testing.T) {
	want := map[string][]string{
		"chatml":  {"<|im_end|>"},
		"llama3":  {"<|eot_id|>"},
		"llama2":  {"</s>"},
		"mistral": {"</s>"},
		"gemma":   {"<end_of_turn>"},
		"phi3":    {"<|end|>", "<|endoftext|>"},
		"phi4":    {"<|im_end|>"},
		"zephyr":  {"</s>", "<|user|>"},
		"plain":   {"\nUser:", "\nSystem:"},
	}
	for name, w := range want {
		tmpl := mustTemplate(t, name)
		got := tmpl.Stops()
		if !slices.Equal(got, w) {
			t.Errorf("%s: Stops() = %q, want %q", name, got, w)
		}
		got[0] = "mutated"
		if tmpl.Stops()[0] == "mutated" {
			t.Errorf("%s: Stops() shares its slice with the caller", name)
		}
	}
}

// TestDetectTemplateReal runs detection over real tokenizer.chat_template
// strings of many models (testdata/hf_templates.json, from Ollama's
// template index, MIT licence), keyed by the family Ollama gives them.
func TestDetectTemplateReal(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "hf_templates.json"))
	if err != nil {
		t.Fatal(err)
	}
	var templates []struct {
		Template string `json:"template"`
		Name     string `json:"name"`
	}
	if err := json.Unmarshal(raw, &templates); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"chatml":           "chatml",
		"zephyr":           "zephyr",
		"mistral-instruct": "mistral",
		"llama2-chat":      "llama2",
		"gemma-instruct":   "gemma",
		"gemma3-instruct":  "gemma",
		"llama3-instruct":  "llama3",
		"phi-3":            "phi3",
	}
	seen := map[string]bool{}
	for i, tt := range templates {
		w, ok := want[tt.Name]
		if !ok {
			w = "plain" // a family Parley does not render: the transcript fallback
		}
		seen[w] = true
		if got := chat.DetectTemplate(tt.Template).Name(); got != w {
			t.Errorf("template %d (%s): detected %s, want %s", i, tt.Name, got, w)
		}
	}
	if len(seen) != 8 {
		t.Errorf("the real templates covered %d families, want 8: %v", len(seen), seen)
	}
}

func TestDetectTemplate(t *testing.T) {
	tests := []struct {
		name, jinja, want string
		stops             []string // checked when set
	}{
		{"empty", "", "plain", []string{"\nUser:", "\nSystem:"}},
		{"family name", "llama3", "llama3", nil},
		{"alias", "phi-3", "phi3", nil},
		{"phi-4", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endfor %}", "phi4", nil},
		{"smolvlm", "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}: {{ message['content'] }}<end_of_utterance>\n{% endfor %}", "plain", nil},
		{"qwen2.5 with tools", "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- endif %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}", "chatml", nil},
		{"mistral v7", "{{- bos_token }}[SYSTEM_PROMPT]{{ system_message }}[/SYSTEM_PROMPT]{{- '[INST]' + message['content'] + '[/INST]' }}", "mistral", nil},
		{"stablelm zephyr", "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '<|endoftext|>' }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + '<|endoftext|>' }}{% endif %}{% endfor %}", "zephyr", []string{"<|endoftext|>", "<|user|>"}},
		{"chatglm4", "[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>\n{{ item['content'] }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}", "plain", nil},
		{"command-r", "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}", "plain", nil},
		{"unknown", "{{ messages }}", "plain", nil},
	}
	for _, tt := range tests {
		tmpl := chat.DetectTemplate(tt.jinja)
		if tmpl.Name() != tt.want {
			t.Errorf("%s: detected %s, want %s", tt.name, tmpl.Name(), tt.want)
		}
		if tt.stops != nil && !slices.Equal(tmpl.Stops(), tt.stops) {
			t.Errorf("%s: stops %q, want %q", tt.name, tmpl.Stops(), tt.stops)
		}
	}
}
