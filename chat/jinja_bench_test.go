package chat_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// benchTemplates are the largest of the golden corpus, and the most used reasoning template.
var benchTemplates = []string{"openai-gpt-oss-120b", "google-gemma-4-31B-it", "Apertus-8B-Instruct",
	"GigaChat3-10B-A1.8B", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct"}

// conversation200 is a 200-message conversation (a system prompt, then turns with thoughts in the history).
func conversation200() []parley.Message {
	msgs := []parley.Message{{Role: parley.RoleSystem, Content: "You are a helpful assistant."}}
	for i := 0; len(msgs) < 199; i++ {
		msgs = append(msgs, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("Question %d: tell me about the number %d, briefly.", i, i)},
			parley.Message{Role: parley.RoleAssistant, Content: fmt.Sprintf("The number %d is %s; that is all there is to say.", i, map[bool]string{true: "even", false: "odd"}[i%2 == 0]),
				Reasoning: "The user asks about a number. I should answer briefly."})
	}
	return append(msgs, parley.Message{Role: parley.RoleUser, Content: "Thanks, one more: 1000?"})
}

// BenchmarkJinjaRender200 renders a 200-message conversation with the largest templates: in process, and through
// the sandbox (the server's path: a pipe round trip to the child process).
func BenchmarkJinjaRender200(b *testing.B) {
	msgs := conversation200()
	sb := chat.NewSandbox()
	defer sb.Close()
	for _, name := range benchTemplates {
		src, err := os.ReadFile("testdata/templates/" + name + ".jinja")
		if err != nil {
			b.Fatal(err)
		}
		for _, mode := range []struct {
			name string
			r    chat.JinjaRenderer
		}{{"in-process", &chat.InProcess{}}, {"sandbox", sb}} {
			t := chat.NewJinja(string(src), chat.JinjaConfig{Renderer: mode.r})
			b.Run(name+"/"+mode.name, func(b *testing.B) {
				out, err := t.RenderJinja(msgs, chat.Gen)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(out)))
				for b.Loop() {
					if _, err := t.RenderJinja(msgs, chat.Gen); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
