package web_test

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/gorilla/websocket"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/jsonmode"
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

func TestResponsesReasoning(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	var got struct {
		ID     string `json:"id"`
		Output []struct {
			Type    string `json:"type"`
			ID      string `json:"id"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage struct {
			OutputTokens        int `json:"output_tokens"`
			OutputTokensDetails struct {
				ReasoningTokens int `json:"reasoning_tokens"`
			} `json:"output_tokens_details"`
		} `json:"usage"`
	}
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "hi"}), http.StatusOK, &got)
	if len(got.Output) != 2 || got.Output[0].Type != "reasoning" || got.Output[1].Type != "message" {
		t.Fatalf("output %+v, want a reasoning item then a message", got.Output)
	}
	if th, ans := got.Output[0].Content[0], got.Output[1].Content[0]; th.Type != "reasoning_text" || th.Text != qwenThought || ans.Text != qwenAnswer {
		t.Errorf("reasoning %+v answer %+v", th, ans)
	}
	if r := got.Usage.OutputTokensDetails.ReasoningTokens; r < 3 || r >= got.Usage.OutputTokens {
		t.Errorf("reasoning_tokens %d of %d output tokens", r, got.Usage.OutputTokens)
	}
	// Stored apart: GET returns the same two items.
	var again struct {
		Output []struct {
			Type string `json:"type"`
		} `json:"output"`
	}
	res, err := http.Get(s.base + "/v1/responses/" + got.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	decodeBody(t, res, http.StatusOK, &again)
	if len(again.Output) != 2 || again.Output[0].Type != "reasoning" {
		t.Errorf("stored response output %+v", again.Output)
	}

	// Streamed: the reasoning item's events, then the message's.
	stream := post(t, s.base+"/v1/responses", map[string]any{"input": "hi", "stream": true})
	var types []string
	var thought, answer strings.Builder
	raw, err := io.ReadAll(stream.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		var ev struct {
			Type        string `json:"type"`
			Delta       string `json:"delta"`
			OutputIndex int    `json:"output_index"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case "response.reasoning_text.delta":
			thought.WriteString(ev.Delta)
			continue
		case "response.output_text.delta":
			if ev.OutputIndex != 1 {
				t.Errorf("output_text.delta at output_index %d, want 1", ev.OutputIndex)
			}
			answer.WriteString(ev.Delta)
			continue
		}
		types = append(types, ev.Type)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.done",
		"response.output_item.done", "response.output_item.added", "response.content_part.added", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.completed"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Errorf("events\n%v\nwant\n%v", types, want)
	}
	if thought.String() != qwenThought || answer.String() != qwenAnswer {
		t.Errorf("streamed reasoning %q answer %q", thought.String(), answer.String())
	}
}

func TestWebSocketReasoning(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64})

	// Text mode: the answer only by default.
	ws := dial(t, s.url+"/ws", nil)
	ws.WriteMessage(websocket.TextMessage, []byte("hi"))
	if got := strings.Join(readReply(t, ws), ""); got != qwenAnswer {
		t.Errorf("text mode: %q, want the answer only", got)
	}
	// ?thinking=show: the thought first, between marker frames.
	ws = dial(t, s.url+"/ws?thinking=show", nil)
	ws.WriteMessage(websocket.TextMessage, []byte("hi"))
	pieces := readReply(t, ws)
	if got := strings.Join(pieces, ""); got != web.ThinkOpen+qwenThought+web.ThinkClose+qwenAnswer || pieces[0] != web.ThinkOpen {
		t.Errorf("text mode, thinking shown: %q", pieces)
	}

	// JSON mode: thinking messages before the answer's tokens; the done message and the stored history keep the
	// thought apart.
	ws = dial(t, s.url+"/ws?format=json", nil)
	sid := readJSON(t, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "hi"})
	var thought, answer strings.Builder
	for {
		m := readJSON(t, ws)
		if m.Type == "thinking" {
			if answer.Len() > 0 {
				t.Errorf("thinking %q after the answer began", m.Text)
			}
			thought.WriteString(m.Text)
			continue
		}
		if m.Type == "token" {
			answer.WriteString(m.Text)
			continue
		}
		if m.Type != "done" || m.Content != qwenAnswer || m.Thinking != qwenThought || m.Usage.ReasoningTokens < 3 {
			t.Fatalf("final message %+v", m)
		}
		break
	}
	if thought.String() != qwenThought || answer.String() != qwenAnswer {
		t.Errorf("json mode: thinking %q tokens %q", thought.String(), answer.String())
	}
	ws.Close()
	ws = dial(t, s.url+"/ws?format=json&session="+sid, nil)
	hist := readJSON(t, ws).Messages
	if len(hist) != 2 || hist[1].Content != qwenAnswer || hist[1].Reasoning != qwenThought {
		t.Fatalf("stored history %+v", hist)
	}
	// The next turn's prompt is what Qwen3's template makes of the history: the earlier thought is dropped.
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "again"})
	for m := readJSON(t, ws); m.Type != "done"; m = readJSON(t, ws) {
	}
	prompts := s.sessions.Prompts()
	if last := prompts[len(prompts)-1]; strings.Contains(last, qwenThought) || !strings.Contains(last, qwenAnswer) {
		t.Errorf("second prompt keeps the earlier thought or loses the answer:\n%s", last)
	}
}

func chatReasoning(t *testing.T, s *stack, extra map[string]any) reasoningChat {
	t.Helper()
	body := map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 64}
	for k, v := range extra {
		body[k] = v
	}
	var got reasoningChat
	decodeBody(t, post(t, s.base+"/v1/chat/completions", body), http.StatusOK, &got)
	return got
}

// A JSON schema applies from the end of the thought: the thought is free text, the answer parses.
func TestReasoningSchemaAfterThought(t *testing.T) {
	for _, m := range []struct{ name, model, thought string }{
		{"qwen3", qwen3Model(t), qwenThought}, {"gpt-oss", gptOSSModel(t), ossThought},
	} {
		t.Run(m.name, func(t *testing.T) {
			s := openStack(t, stackOpts{model: m.model, maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
				return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
			}})
			schema := map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}},
				"required": []string{"ok"}, "additionalProperties": false}
			// Room for the whitespace the grammar allows and a scripted model wanders into before it closes.
			got := chatReasoning(t, s, map[string]any{"max_tokens": 300, "response_format": map[string]any{"type": "json_schema",
				"json_schema": map[string]any{"name": "r", "schema": schema}}})
			msg := got.Choices[0].Message
			if msg.ReasoningContent != m.thought {
				t.Errorf("reasoning_content %q, want the free thought %q", msg.ReasoningContent, m.thought)
			}
			var answer struct {
				OK *bool `json:"ok"`
			}
			if err := json.Unmarshal([]byte(msg.Content), &answer); err != nil || answer.OK == nil {
				t.Errorf("content %q does not parse against the schema: %v", msg.Content, err)
			}
			t.Logf("thought %q, answer %q, usage %+v", msg.ReasoningContent, msg.Content, got.Usage)
		})
	}
}

// At the budget Parley closes the thought itself and the answer follows.
func TestReasoningBudget(t *testing.T) {
	// The budget covers the thought's markers too: gpt-oss's header <|channel|>analysis<|message|> is 8 tokens here.
	for _, m := range []struct {
		name, model, thought string
		budget               int
	}{
		{"qwen3", qwen3Model(t), qwenThought, 5}, {"gpt-oss", gptOSSModel(t), ossThought, 12},
	} {
		t.Run(m.name, func(t *testing.T) {
			s := openStack(t, stackOpts{model: m.model, maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
				return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
			}})
			got := chatReasoning(t, s, map[string]any{"think_budget": m.budget})
			msg := got.Choices[0].Message
			if msg.ReasoningContent == "" || msg.ReasoningContent == m.thought || !strings.HasPrefix(m.thought, msg.ReasoningContent) {
				t.Errorf("reasoning_content %q, want a cut prefix of %q", msg.ReasoningContent, m.thought)
			}
			if msg.Content == "" {
				t.Error("no answer after the budget")
			}
			// The budget's tokens and the closing tokens Parley wrote.
			if r := got.Usage.CompletionTokensDetails.ReasoningTokens; r > m.budget+8 {
				t.Errorf("reasoning_tokens %d for a budget of %d", r, m.budget)
			}
			t.Logf("thought %q, answer %q, usage %+v", msg.ReasoningContent, msg.Content, got.Usage)
			if bad := chatReasoningStatus(t, s, map[string]any{"think_budget": -1}); bad != http.StatusBadRequest {
				t.Errorf("think_budget -1: status %d", bad)
			}
		})
	}
}

func chatReasoningStatus(t *testing.T, s *stack, extra map[string]any) int {
	body := map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}}
	for k, v := range extra {
		body[k] = v
	}
	return post(t, s.base+"/v1/chat/completions", body).StatusCode
}

// Thinking switched off per request reaches the template (Qwen3 closes an empty thought in the prompt).
func TestReasoningOff(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	ws := dial(t, s.url+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "hi", "params": map[string]any{"think": false}})
	var done jsonmode.Message
	for done = readJSON(t, ws); done.Type != "done"; done = readJSON(t, ws) {
		if done.Type == "thinking" {
			t.Errorf("a thinking message with thinking off: %q", done.Text)
		}
	}
	prompts := s.sessions.Prompts()
	if !strings.HasSuffix(prompts[0], "<think>\n\n</think>\n\n") || done.Thinking != "" {
		t.Errorf("prompt %q, done %+v", prompts[0], done)
	}
	if status := chatReasoningStatus(t, s, map[string]any{"reasoning_effort": "extreme"}); status != http.StatusBadRequest {
		t.Errorf("reasoning_effort extreme: status %d", status)
	}
}

// Warm across turns: Qwen3's template drops earlier thoughts, so each turn's prompt rewrites the previous reply;
// only that rewritten tail and the new message are evaluated again, not the conversation.
func TestReasoningWarmAcrossTurns(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64})
	ws := dial(t, s.url+"/ws?format=json", nil)
	readJSON(t, ws)
	var evaluated []int
	for i := range 10 {
		ws.WriteJSON(map[string]any{"type": "prompt", "content": fmt.Sprintf("turn %d", i)})
		m := readJSON(t, ws)
		for ; m.Type != "done"; m = readJSON(t, ws) {
			if m.Type == "error" {
				t.Fatalf("turn %d: %+v", i, m)
			}
		}
		evaluated = append(evaluated, m.Usage.PromptTokens-m.Usage.CachedPromptTokens)
		if i == 9 {
			t.Logf("turn 10: prompt %d tokens, %d cached", m.Usage.PromptTokens, m.Usage.CachedPromptTokens)
		}
	}
	t.Logf("prompt tokens evaluated per turn: %v", evaluated)
	for i, n := range evaluated[1:] {
		// The previous reply without its thought, the new message and the headers: tens of tokens, flat.
		if n > 2*evaluated[1]+8 || n > 120 {
			t.Errorf("turn %d evaluated %d prompt tokens (turn 2: %d): the history is re-read", i+2, n, evaluated[1])
		}
	}
}

// Gemma 4 marks its thought with <|channel>thought ... <channel|>, when a request switches thinking on.
func TestReasoningGemma4(t *testing.T) {
	model := testmodel.Scripted(t, &synth.Script{
		Template: realTemplate(t, "google-gemma-4-31B-it"),
		Control:  []string{"<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"},
		After:    "\n",
		Reply:    "<|channel>thought " + qwenThought + "<channel|>" + qwenAnswer, // no "\n": it is the token the reply follows
	})
	s := openStack(t, stackOpts{model: model, maxTokens: 64})
	ws := dial(t, s.url+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "hi", "params": map[string]any{"think": true}})
	var thought strings.Builder
	m := readJSON(t, ws)
	for ; m.Type != "done"; m = readJSON(t, ws) {
		if m.Type == "thinking" {
			thought.WriteString(m.Text)
		}
	}
	if m.Thinking != qwenThought || thought.String() != qwenThought || m.Content != qwenAnswer {
		t.Errorf("done %+v, streamed thought %q", m, thought.String())
	}
	if p := s.sessions.Prompts()[0]; !strings.Contains(p, "<|think|>") {
		t.Errorf("thinking on did not reach the template: %q", p)
	}
}

// A client that sends a response's output back as input (a reasoning item, then the assistant message) has the
// thought stored with that message, apart from its text.
func TestResponsesReasoningInput(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	ws := dial(t, s.url+"/ws?format=json", nil)
	sid := readJSON(t, ws).SessionID()
	ws.Close()
	input := []map[string]any{
		{"type": "message", "role": "user", "content": "What is 2+2?"},
		{"type": "reasoning", "summary": []any{}, "content": []map[string]any{{"type": "reasoning_text", "text": "Two and two."}}},
		{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": "4"}}},
		{"type": "message", "role": "user", "content": "And 3+3?"},
	}
	res := post(t, s.base+"/v1/responses", map[string]any{"input": input, "conversation": sid})
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	io.Copy(io.Discard, res.Body)
	ws = dial(t, s.url+"/ws?format=json&session="+sid, nil)
	hist := readJSON(t, ws).Messages
	if len(hist) != 4 || hist[1].Role != "assistant" || hist[1].Content != "4" || hist[1].Reasoning != "Two and two." ||
		hist[3].Reasoning != qwenThought {
		t.Errorf("stored history %+v", hist)
	}
	bad := post(t, s.base+"/v1/responses", map[string]any{"input": []map[string]any{
		{"type": "reasoning", "content": []map[string]any{{"type": "image", "url": "x"}}}, {"role": "user", "content": "hi"}}})
	if bad.StatusCode != http.StatusBadRequest {
		t.Errorf("a reasoning item with an image: status %d", bad.StatusCode)
	}
}

// A reply's thought is a reasoning item before its message in the conversation's items and in a later response's
// input_items, with OpenAI's shape (summary [], content of reasoning_text), and GET finds it by its id.
func TestConversationItemsReasoning(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	var conv struct {
		ID string `json:"id"`
	}
	decodeBody(t, post(t, s.base+"/v1/conversations", map[string]any{}), http.StatusOK, &conv)
	var first struct {
		Output []struct {
			ID string `json:"id"`
		} `json:"output"`
	}
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "hi", "conversation": conv.ID}), http.StatusOK, &first)
	type item struct {
		Type    string            `json:"type"`
		ID      string            `json:"id"`
		Role    string            `json:"role"`
		Summary []json.RawMessage `json:"summary"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	var items struct {
		Data []item `json:"data"`
	}
	getJSON(t, s.base+"/v1/conversations/"+conv.ID+"/items?order=asc", &items)
	d := items.Data
	if len(d) != 3 || d[0].Role != "user" || d[1].Type != "reasoning" || d[2].Type != "message" || d[2].Role != "assistant" {
		t.Fatalf("items %+v, want the user's message, a reasoning item, the answer", d)
	}
	if d[1].Summary == nil || len(d[1].Summary) != 0 || len(d[1].Content) != 1 || d[1].Content[0].Type != "reasoning_text" ||
		d[1].Content[0].Text != qwenThought || d[2].Content[0].Text != qwenAnswer {
		t.Errorf("reasoning item %+v, answer %+v", d[1], d[2])
	}
	if len(first.Output) != 2 || first.Output[0].ID != d[1].ID || first.Output[1].ID != d[2].ID {
		t.Errorf("the response's output %+v names other items than %s, %s", first.Output, d[1].ID, d[2].ID)
	}
	var one item
	getJSON(t, s.base+"/v1/conversations/"+conv.ID+"/items/"+d[1].ID, &one)
	if one.Type != "reasoning" || one.ID != d[1].ID || one.Content[0].Text != qwenThought {
		t.Errorf("GET the reasoning item: %+v", one)
	}

	// A thought sent back as input is an input item before its message.
	var second struct {
		ID string `json:"id"`
	}
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"conversation": conv.ID, "input": []map[string]any{
		{"type": "reasoning", "summary": []any{}, "content": []map[string]any{{"type": "reasoning_text", "text": "Two and two."}}},
		{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": "4"}}},
		{"type": "message", "role": "user", "content": "And 3+3?"},
	}}), http.StatusOK, &second)
	getJSON(t, s.base+"/v1/responses/"+second.ID+"/input_items?order=asc", &items)
	d = items.Data
	if len(d) != 3 || d[0].Type != "reasoning" || d[0].Content[0].Text != "Two and two." || d[1].Role != "assistant" || d[2].Role != "user" {
		t.Errorf("input_items %+v, want a reasoning item, the assistant's message, the user's", d)
	}
}
