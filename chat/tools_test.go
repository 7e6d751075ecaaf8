package chat_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// TestRenderToolsGolden: the chatml family renders tools, calls and results
// exactly as Qwen 2.5's real template does (testdata/tools_golden.json,
// written by tools_golden.py with Jinja2).
func TestRenderToolsGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/tools_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Conversation string `json:"conversation"`
		Messages     []struct {
			Role       string `json:"role"`
			Content    string `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Function parley.Tool `json:"function"`
		} `json:"tools"`
		Gen  bool   `json:"add_generation_prompt"`
		Want string `json:"want"`
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	tmpl := mustTemplate(t, chat.NameChatML)
	for _, c := range cases {
		var msgs []parley.Message
		for _, m := range c.Messages {
			pm := parley.Message{Role: parley.Role(m.Role), Content: m.Content, ToolCallID: m.ToolCallID}
			for _, tc := range m.ToolCalls {
				pm.ToolCalls = append(pm.ToolCalls, parley.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: string(tc.Function.Arguments)})
			}
			msgs = append(msgs, pm)
		}
		var tools []parley.Tool
		for _, tl := range c.Tools {
			tools = append(tools, tl.Function)
		}
		got, err := tmpl.Render(msgs, chat.RenderOptions{AddGenerationPrompt: c.Gen, Tools: tools})
		if err != nil {
			t.Fatal(err)
		}
		if got != c.Want {
			t.Errorf("%s:\n got %q\nwant %q", c.Conversation, got, c.Want)
		}
	}
}

// TestRenderToolsFamilies: every family renders a call and its result (in
// its own format or the generic one) and keeps the tools' names in the
// prompt.
func TestRenderToolsFamilies(t *testing.T) {
	msgs := []parley.Message{
		{Role: parley.RoleSystem, Content: "Be brief."},
		{Role: parley.RoleUser, Content: "Weather?"},
		{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{{ID: "abc123def", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: parley.RoleTool, ToolCallID: "abc123def", Content: "sunny"},
		{Role: parley.RoleUser, Content: "Thanks"},
	}
	tools := []parley.Tool{{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}}
	want := map[string][]string{
		chat.NameChatML:  {"<tools>\n{\"type\": \"function\"", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "<tool_response>\nsunny\n</tool_response>"},
		chat.NameLlama3:  {"\"name\": \"get_weather\"", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>", "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>"},
		chat.NameMistral: {"[AVAILABLE_TOOLS] [{\"type\": \"function\"", "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]</s>", "[TOOL_RESULTS] {\"content\": \"sunny\", \"call_id\": \"abc123def\"}[/TOOL_RESULTS]"},
		chat.NamePlain:   {"<tools>", "<tool_call>", "<tool_response>\nsunny\n</tool_response>"},
		chat.NameGemma:   {"<tools>", "<tool_call>", "<tool_response>"},
	}
	for name, parts := range want {
		got, err := mustTemplate(t, name).Render(msgs, chat.RenderOptions{AddGenerationPrompt: true, Tools: tools})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range parts {
			if !strings.Contains(got, p) {
				t.Errorf("%s: prompt lacks %q:\n%s", name, p, got)
			}
		}
	}
}
