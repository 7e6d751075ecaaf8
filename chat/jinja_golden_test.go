package chat_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// goldenNow is strftime_now's clock in the golden renders (both engines), so that dated templates compare.
var goldenNow = time.Date(2026, time.March, 7, 12, 0, 0, 0, time.UTC)

// goldenBOS and goldenEOS stand in for every model's BOS and EOS texts.
const goldenBOS, goldenEOS = "<s>", "</s>"

type goldenCase struct {
	name string
	msgs []parley.Message
	opt  chat.RenderOptions
}

func goldenCases() []goldenCase {
	off, on := false, true
	weather := parley.Tool{Name: "get_weather", Description: "Get the current weather <in> a city & country",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","description":"City name"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}`)}
	history := []parley.Message{
		{Role: parley.RoleSystem, Content: "You are a helpful assistant."},
		{Role: parley.RoleUser, Content: "Hello"},
		{Role: parley.RoleAssistant, Content: "Hi there! How can I help?"},
		{Role: parley.RoleUser, Content: "Who are you?"},
		{Role: parley.RoleAssistant, Content: "  I am an assistant.  "},
		{Role: parley.RoleUser, Content: "Ça va? 日本語 🌍"},
	}
	// A tool schema as clients send them in 2026: a nullable type given as a list, a null default, an enum, a nested
	// object and an array, non-ASCII text. Tool templates print defaults (None in jinja2) and render types.
	booking := parley.Tool{Name: "book_table", Description: "Réserver une table — book a table",
		Parameters: json.RawMessage(`{"type":"object","properties":{"restaurant":{"type":"string","description":"Nom du restaurant"},` +
			`"guests":{"type":["integer","null"],"default":null,"minimum":1},"seating":{"type":"string","enum":["inside","terrace"],"default":"inside"},` +
			`"contact":{"type":"object","properties":{"phone":{"type":"string"}},"required":["phone"]},` +
			`"dietary":{"type":"array","items":{"type":"string"}},"vip":{"type":"boolean","default":false}},"required":["restaurant"]}`)}
	thought := []parley.Message{
		{Role: parley.RoleUser, Content: "What is 2+2?"},
		{Role: parley.RoleAssistant, Content: "4", Reasoning: "The user asks for 2+2. That is 4."},
		{Role: parley.RoleUser, Content: "And 3+3?"},
	}
	return []goldenCase{
		{"plain", []parley.Message{{Role: parley.RoleSystem, Content: "You are a helpful assistant."}, {Role: parley.RoleUser, Content: "Hello"}}, chat.Gen},
		{"user-only", []parley.Message{{Role: parley.RoleUser, Content: "Hello"}}, chat.Gen},
		{"multi-turn", history, chat.Gen},
		{"no-generation-prompt", history[:5], chat.RenderOptions{}},
		{"tools", []parley.Message{
			{Role: parley.RoleUser, Content: "What is the weather in Paris?"},
			{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris","unit":"c"}`}}},
			{Role: parley.RoleTool, ToolCallID: "call_1", Name: "get_weather", Content: `{"temperature":21,"sky":"clear"}`},
		}, chat.RenderOptions{AddGenerationPrompt: true, Tools: []parley.Tool{weather}}},
		{"tools-schema", []parley.Message{
			{Role: parley.RoleSystem, Content: "Tu es un assistant."},
			{Role: parley.RoleUser, Content: "Une table pour 2 à «Chez Léon» ☕"},
			{Role: parley.RoleAssistant, Content: "Je réserve.", Reasoning: "The user wants a table.", ToolCalls: []parley.ToolCall{{ID: "call_9",
				Name: "book_table", Arguments: `{"restaurant":"Chez Léon","guests":2,"contact":{"phone":"+33 1"},"dietary":[],"vip":null}`}}},
			{Role: parley.RoleTool, ToolCallID: "call_9", Name: "book_table", Content: `{"ok":true,"table":12,"note":null}`},
			{Role: parley.RoleAssistant, Content: "C'est réservé : table 12."},
			{Role: parley.RoleUser, Content: "Merci !"},
		}, chat.RenderOptions{AddGenerationPrompt: true, Tools: []parley.Tool{booking, weather}}},
		{"thinking-history", thought, chat.Gen},
		{"thinking-on", thought, chat.RenderOptions{AddGenerationPrompt: true, Thinking: &on}},
		{"thinking-off", thought, chat.RenderOptions{AddGenerationPrompt: true, Thinking: &off}},
	}
}

// goldenExceptions are the cases where Parley's render differs from jinja2's: "template/case" -> why, or
// "template/*" for every case not identical (none at present). A case listed by name must still differ (a fixed gap
// leaves the list).
var goldenExceptions = map[string]string{}

// goldenTemplate is one template of the golden corpus: its name and source.
type goldenTemplate struct{ name, src string }

// goldenTemplates returns the golden corpus: every file under testdata/templates, then every template of
// testdata/hf_templates.json that is not already a file (named hf-NN-family), then the .jinja files of the folder
// PARLEY_JINJA_CORPUS names, if set (more templates to compare locally, that the repository does not hold).
func goldenTemplates(t *testing.T) []goldenTemplate {
	t.Helper()
	paths, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(paths) < 70 {
		t.Fatalf("templates: %d found, err %v", len(paths), err)
	}
	sort.Strings(paths)
	var out []goldenTemplate
	seen := map[string]bool{}
	add := func(name, src string) {
		if seen[strings.TrimSuffix(src, "\n")] {
			return
		}
		seen[strings.TrimSuffix(src, "\n")] = true
		out = append(out, goldenTemplate{name: name, src: src})
	}
	read := func(paths []string) {
		for _, path := range paths {
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			add(strings.TrimSuffix(filepath.Base(path), ".jinja"), string(src))
		}
	}
	read(paths)
	raw, err := os.ReadFile("testdata/hf_templates.json")
	if err != nil {
		t.Fatal(err)
	}
	var hf []struct{ Name, Template string }
	if err := json.Unmarshal(raw, &hf); err != nil {
		t.Fatal(err)
	}
	for i, h := range hf {
		add(fmt.Sprintf("hf-%02d-%s", i, h.Name), h.Template)
	}
	if dir := os.Getenv("PARLEY_JINJA_CORPUS"); dir != "" {
		extra, err := filepath.Glob(filepath.Join(dir, "*.jinja"))
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(extra)
		read(extra)
	}
	if len(out) < 100 {
		t.Fatalf("the golden corpus holds %d distinct templates, want at least 100", len(out))
	}
	return out
}

// TestJinjaGolden renders every template of the golden corpus (goldenTemplates: real chat templates, and
// reconstructions of the constructs of others, each with its source in testdata/README.md) for each golden case
// with Parley's engine and with Python's jinja2 as Hugging Face runs it, and requires the same bytes, or both to
// fail.
func TestJinjaGolden(t *testing.T) {
	needJinja2(t)
	templates := goldenTemplates(t)
	type pyCase struct {
		Source string          `json:"source"`
		Vars   json.RawMessage `json:"vars"`
	}
	type result struct {
		name, goOut string
		goErr       error
	}
	var (
		py      []pyCase
		results []result
	)
	cases := goldenCases()
	for _, tt := range templates {
		tmpl := chat.NewJinja(tt.src, chat.JinjaConfig{BOSToken: goldenBOS, EOSToken: goldenEOS, Now: func() time.Time { return goldenNow }})
		for _, c := range cases {
			vars, err := chat.BuildVars(c.msgs, c.opt, goldenBOS, goldenEOS, goldenNow.Unix(), strings.Contains(tt.src, ".thinking"))
			if err != nil {
				t.Fatal(err)
			}
			py = append(py, pyCase{Source: tt.src, Vars: vars})
			out, err := tmpl.RenderJinja(c.msgs, c.opt)
			results = append(results, result{name: tt.name + "/" + c.name, goOut: out, goErr: err})
		}
	}
	want := renderJinja2(t, py, len(results))
	same, bothFail, excepted := 0, 0, 0
	used := map[string]bool{} // the wildcard exceptions some case needs
	for i, r := range results {
		w := want[i]
		why, listed := goldenExceptions[r.name]
		wildcard := false
		if !listed {
			why, wildcard = goldenExceptions[r.name[:strings.Index(r.name, "/")]+"/*"]
			listed = wildcard
		}
		var ok bool
		switch {
		case w.Out == nil && r.goErr != nil:
			bothFail++
			ok = true
			t.Logf("%s: both refuse: jinja2 %s; Parley %v", r.name, w.Err, r.goErr)
			// A template's own refusal (raise_exception) reads the same; a recursion is a template limit.
			if msg, raised := strings.CutPrefix(w.Err, "TemplateError: "); raised && !strings.Contains(r.goErr.Error(), msg) {
				t.Errorf("%s: jinja2 refuses with the template's message %q, Parley with %v", r.name, msg, r.goErr)
			}
			if strings.HasPrefix(w.Err, "RecursionError") && !errors.Is(r.goErr, chat.ErrTemplateLimit) {
				t.Errorf("%s: jinja2 raises RecursionError, Parley refuses with %v, not a template limit", r.name, r.goErr)
			}
		case w.Out != nil && r.goErr == nil:
			ok = strings.TrimPrefix(*w.Out, goldenBOS) == r.goOut
			if ok {
				same++
			}
		}
		switch {
		case ok && listed && !wildcard:
			t.Errorf("%s: listed as an exception (%s) but now renders like jinja2: take it off the list", r.name, why)
		case !ok && listed:
			excepted++
			if wildcard {
				used[r.name[:strings.Index(r.name, "/")]+"/*"] = true
			}
		case !ok:
			if w.Out == nil {
				t.Errorf("%s: jinja2 fails (%s), Parley renders:\n%q", r.name, w.Err, r.goOut)
			} else if r.goErr != nil {
				t.Errorf("%s: Parley fails (%v), jinja2 renders:\n%q", r.name, r.goErr, *w.Out)
			} else {
				t.Errorf("%s: differs from jinja2:\n got %q\nwant %q", r.name, r.goOut, strings.TrimPrefix(*w.Out, goldenBOS))
			}
		}
	}
	for name, why := range goldenExceptions {
		if strings.HasSuffix(name, "/*") && !used[name] {
			t.Errorf("%s: listed as an exception (%s) but every case now renders like jinja2: take it off the list", name, why)
		}
	}
	t.Logf("%d templates x %d cases: %d byte-identical, %d fail in both engines, %d documented exceptions",
		len(templates), len(cases), same, bothFail, excepted)
}
