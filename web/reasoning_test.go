package web_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/web"
)

// Reasoning on the real path: synthetic models (internal/synth) that carry a real reasoning template and whose
// greedy reply is a thought, then an answer.

const (
	qwenThought = "The user says hi. I should greet them."
	qwenAnswer  = "Hello there, how are you today?"
	ossThought  = "Think about it."
	ossAnswer   = "Blue is the answer."
)

func realTemplate(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile("../chat/testdata/templates/" + name + ".jinja")
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// qwen3Model is a Qwen3-style model with Qwen3's own template.
func qwen3Model(tb testing.TB) string {
	s := synth.ChatMLThinking()
	s.Template = realTemplate(tb, "Qwen-Qwen3-0.6B")
	return testmodel.Scripted(tb, s)
}

// gptOSSModel is a gpt-oss-style model with gpt-oss's own template: the generation prompt ends with
// <|start|>assistant ("assistant" is an added token, so that it is the token the reply follows).
func gptOSSModel(tb testing.TB) string {
	s := synth.Harmony()
	s.Template = realTemplate(tb, "openai-gpt-oss-120b")
	s.Text = []string{"assistant"}
	s.After = "assistant"
	s.Reply = "<|channel|>analysis<|message|>" + ossThought + "<|end|><|start|>assistant<|channel|>final<|message|>" + ossAnswer + "<|return|>"
	return testmodel.Scripted(tb, s)
}

type reasoningChat struct {
	Choices []struct {
		Message struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens        int `json:"completion_tokens"`
		CompletionTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"completion_tokens_details"`
	} `json:"usage"`
}

func TestOpenAIChatReasoning(t *testing.T) {
	for _, m := range []struct {
		name, model, thought, answer string
	}{
		{"qwen3", qwen3Model(t), qwenThought, qwenAnswer},
		{"gpt-oss", gptOSSModel(t), ossThought, ossAnswer},
	} {
		t.Run(m.name, func(t *testing.T) {
			s := openStack(t, stackOpts{model: m.model, maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
				return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
			}})
			if name := s.responder.Template().Name(); name != "jinja" {
				t.Fatalf("template %s, want the model's own (jinja)", name)
			}
			body := map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 64}
			var got reasoningChat
			decodeBody(t, post(t, s.base+"/v1/chat/completions", body), http.StatusOK, &got)
			msg := got.Choices[0].Message
			if msg.ReasoningContent != m.thought || msg.Content != m.answer {
				t.Errorf("reasoning_content %q content %q, want %q %q", msg.ReasoningContent, msg.Content, m.thought, m.answer)
			}
			if r := got.Usage.CompletionTokensDetails.ReasoningTokens; r < 3 || r >= got.Usage.CompletionTokens {
				t.Errorf("reasoning_tokens %d of %d completion tokens", r, got.Usage.CompletionTokens)
			}

			// Streamed: every reasoning delta comes before the first content delta.
			body["stream"] = true
			res := post(t, s.base+"/v1/chat/completions", body)
			var thought, answer strings.Builder
			for _, data := range readSSE(t, res.Body, "data: ") {
				if data == "[DONE]" {
					break
				}
				var ch struct {
					Choices []struct {
						Delta struct {
							Content          *string `json:"content"`
							ReasoningContent *string `json:"reasoning_content"`
						} `json:"delta"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(data), &ch); err != nil {
					t.Fatal(err)
				}
				for _, c := range ch.Choices {
					if c.Delta.ReasoningContent != nil {
						if answer.Len() > 0 {
							t.Errorf("a reasoning delta %q after the answer began", *c.Delta.ReasoningContent)
						}
						thought.WriteString(*c.Delta.ReasoningContent)
					}
					if c.Delta.Content != nil {
						answer.WriteString(*c.Delta.Content)
					}
				}
			}
			if thought.String() != m.thought || answer.String() != m.answer {
				t.Errorf("streamed: reasoning %q content %q, want %q %q", thought.String(), answer.String(), m.thought, m.answer)
			}
		})
	}
}
