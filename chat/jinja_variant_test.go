package chat_test

import (
	"os"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// A model's tool_use variant renders the requests with tools; the main template renders the rest.
func TestJinjaToolUseVariant(t *testing.T) {
	main, err := os.ReadFile("testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	toolUse, err := os.ReadFile("testdata/templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.LoadJinja(string(main), chat.JinjaConfig{ToolUse: string(toolUse), BOSToken: "<|begin_of_text|>"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "Weather in Paris?"}}
	plain, err := tmpl.Render(msgs, chat.Gen)
	if err != nil || !strings.Contains(plain, "<|im_start|>user\nWeather in Paris?") {
		t.Fatalf("without tools: %q, %v", plain, err)
	}
	tools := chat.RenderOptions{AddGenerationPrompt: true, Tools: []parley.Tool{{Name: "get_weather",
		Description: "Get the weather", Parameters: []byte(`{"type":"object"}`)}}} // the template reads the description (jinja2 fails without)
	with, err := tmpl.Render(msgs, tools)
	if err != nil || !strings.Contains(with, "function calling AI model") || !strings.Contains(with, `"name": "get_weather"`) {
		t.Fatalf("with tools: %q, %v", with, err)
	}
	if strings.Contains(with, "You are Qwen") {
		t.Errorf("the tools request rendered with the main template: %q", with)
	}
}
