package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type oaiUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type oaiLogprobs struct {
	Content []struct {
		Token       string  `json:"token"`
		Logprob     float64 `json:"logprob"`
		Bytes       []int   `json:"bytes"`
		TopLogprobs []struct {
			Token   string  `json:"token"`
			Logprob float64 `json:"logprob"`
		} `json:"top_logprobs"`
	} `json:"content"`
}

type oaiCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Logprobs     *oaiLogprobs `json:"logprobs"`
		FinishReason string       `json:"finish_reason"`
	} `json:"choices"`
	Usage   *oaiUsage `json:"usage"`
	Timings *struct {
		TTFTMS float64 `json:"ttft_ms"`
	} `json:"timings"`
}

type oaiChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs     *oaiLogprobs `json:"logprobs"`
		FinishReason *string      `json:"finish_reason"`
	} `json:"choices"`
	Usage *oaiUsage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func userMsgs(text string) []map[string]any {
	return []map[string]any{{"role": "system", "content": "You tell stories."}, {"role": "user", "content": text}}
}

func chatComplete(tb testing.TB, s *stack, body map[string]any) oaiCompletion {
	tb.Helper()
	var c oaiCompletion
	decodeBody(tb, post(tb, s.base+"/v1/chat/completions", body), http.StatusOK, &c)
	if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || len(c.Choices) != 1 || c.Usage == nil {
		tb.Fatalf("completion %+v", c)
	}
	return c
}

// chatStream returns the chunks of a streamed completion (checking the
// "data: " framing and the closing [DONE]).
func chatStream(tb testing.TB, s *stack, body map[string]any) []oaiChunk {
	tb.Helper()
	body["stream"] = true
	res := post(tb, s.base+"/v1/chat/completions", body)
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("status %d", res.StatusCode)
	}
	events := readSSE(tb, res.Body, "data: ")
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		tb.Fatalf("events %q: want chunks then [DONE]", events)
	}
	var chunks []oaiChunk
	for _, e := range events[:len(events)-1] {
		var c oaiChunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			tb.Fatalf("chunk %q: %v", e, err)
		}
		if c.Object != "chat.completion.chunk" || c.ID != "" && chunks != nil && c.ID != chunks[0].ID {
			tb.Fatalf("chunk %q", e)
		}
		chunks = append(chunks, c)
	}
	return chunks
}

func TestOpenAIChatCompletions(t *testing.T) {
	s := mustOpenAPI(t, nil)
	c := chatComplete(t, s, map[string]any{"model": "anything", "messages": userMsgs("Tell me about a cat."), "max_tokens": 12, "logprobs": true, "top_logprobs": 3})
	ch := c.Choices[0]
	if ch.Message.Role != "assistant" || ch.Message.Content == "" || ch.FinishReason != "length" {
		t.Fatalf("choice %+v", ch)
	}
	u := c.Usage
	if u.CompletionTokens != 12 || u.PromptTokens == 0 || u.TotalTokens != u.PromptTokens+12 || c.Timings == nil {
		t.Fatalf("usage %+v timings %v", u, c.Timings)
	}
	if ch.Logprobs == nil || len(ch.Logprobs.Content) != 12 {
		t.Fatalf("logprobs %+v: want one entry per token", ch.Logprobs)
	}
	var text strings.Builder
	for _, lp := range ch.Logprobs.Content {
		if lp.Logprob > 0 || len(lp.Bytes) != len(lp.Token) || len(lp.TopLogprobs) != 1 || lp.TopLogprobs[0].Token != lp.Token {
			t.Fatalf("logprob entry %+v", lp)
		}
		text.WriteString(lp.Token)
	}
	if text.String() != ch.Message.Content {
		t.Fatalf("logprob tokens %q, content %q", text.String(), ch.Message.Content)
	}

	// max_completion_tokens caps as exactly; a grown conversation reuses
	// the cached prefix of the first (the stateless key follows the conversation).
	msgs := append(userMsgs("Tell me about a cat."), map[string]any{"role": "assistant", "content": ch.Message.Content},
		map[string]any{"role": "user", "content": [](map[string]any){{"type": "text", "text": "And then?"}}})
	c2 := chatComplete(t, s, map[string]any{"messages": msgs, "max_completion_tokens": 5})
	if c2.Usage.CompletionTokens != 5 || c2.Usage.PromptTokensDetails.CachedTokens < u.PromptTokens {
		t.Fatalf("second turn usage %+v: want 5 tokens and the first prompt (%d tokens) cached", c2.Usage, u.PromptTokens)
	}
}

func TestOpenAIStream(t *testing.T) {
	s := mustOpenAPI(t, nil)
	want := chatComplete(t, s, map[string]any{"messages": userMsgs("Hello"), "max_tokens": 16}).Choices[0].Message.Content

	chunks := chatStream(t, s, map[string]any{"messages": userMsgs("Hello"), "max_tokens": 16, "logprobs": true,
		"stream_options": map[string]any{"include_usage": true}})
	if first := chunks[0]; len(first.Choices) != 1 || first.Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk %+v: want the role", first)
	}
	usage := chunks[len(chunks)-1]
	if len(usage.Choices) != 0 || usage.Usage == nil || usage.Usage.CompletionTokens != 16 {
		t.Fatalf("usage chunk %+v", usage)
	}
	final := chunks[len(chunks)-2]
	if len(final.Choices) != 1 || final.Choices[0].FinishReason == nil || *final.Choices[0].FinishReason != "length" {
		t.Fatalf("final chunk %+v", final)
	}
	var text strings.Builder
	contentChunks, logprobs := 0, 0
	for i, c := range chunks[:len(chunks)-1] {
		if c.Usage != nil {
			t.Fatalf("chunk %d carries usage before the end", i)
		}
		if d := c.Choices[0].Delta.Content; d != nil && *d != "" {
			contentChunks++
			text.WriteString(*d)
		}
		if lp := c.Choices[0].Logprobs; lp != nil {
			logprobs += len(lp.Content)
		}
	}
	if text.String() != want || contentChunks < 8 || logprobs != 16 {
		t.Fatalf("streamed %q in %d chunks with %d logprobs; non-streamed %q", text.String(), contentChunks, logprobs, want)
	}

	// Without include_usage no chunk has a usage field.
	for _, c := range chatStream(t, s, map[string]any{"messages": userMsgs("Hello"), "max_tokens": 4}) {
		if c.Usage != nil {
			t.Fatalf("usage without include_usage: %+v", c)
		}
	}
}

func TestOpenAIParameters(t *testing.T) {
	s := mustOpenAPI(t, nil)
	full := chatComplete(t, s, map[string]any{"messages": userMsgs("Once upon a time"), "max_tokens": 30}).Choices[0].Message.Content
	words := strings.Fields(full)
	stop := words[len(words)/2]
	c := chatComplete(t, s, map[string]any{"messages": userMsgs("Once upon a time"), "max_tokens": 30, "stop": []string{stop, "qqq"}})
	if got := c.Choices[0]; got.Message.Content != full[:strings.Index(full, stop)] || got.FinishReason != "stop" {
		t.Fatalf("stop %q: %q (%s), full reply %q", stop, got.Message.Content, got.FinishReason, full)
	}

	sampled := func(seed int) string {
		return chatComplete(t, s, map[string]any{"messages": userMsgs("A dog"), "max_tokens": 20, "temperature": 1.3, "top_p": 1, "seed": seed}).Choices[0].Message.Content
	}
	if a, b := sampled(7), sampled(7); a != b {
		t.Fatalf("seed 7 twice: %q vs %q", a, b)
	}

	schema := map[string]any{
		"type":                 "object",
		"properties":           map[string]any{"name": map[string]any{"type": "string", "enum": []string{"Tom", "Lily"}}, "age": map[string]any{"type": "integer", "minimum": 1, "maximum": 9}},
		"required":             []string{"name", "age"},
		"additionalProperties": false,
	}
	js := chatComplete(t, s, map[string]any{"messages": userMsgs("Who?"), "max_tokens": 80,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "who", "strict": true, "schema": schema}}})
	var who struct {
		Name string `json:"name"`
		Age  *int   `json:"age"`
	}
	if err := json.Unmarshal([]byte(js.Choices[0].Message.Content), &who); err != nil || (who.Name != "Tom" && who.Name != "Lily") ||
		who.Age == nil || *who.Age < 1 || *who.Age > 9 || js.Choices[0].FinishReason != "stop" {
		t.Fatalf("json_schema reply %q (%s): %v", js.Choices[0].Message.Content, js.Choices[0].FinishReason, err)
	}
	obj := chatComplete(t, s, map[string]any{"messages": userMsgs("Who?"), "max_tokens": 8, "response_format": map[string]any{"type": "json_object"}})
	if !strings.HasPrefix(strings.TrimSpace(obj.Choices[0].Message.Content), "{") {
		t.Fatalf("json_object reply %q does not start an object", obj.Choices[0].Message.Content)
	}
}

func TestOpenAIValidation(t *testing.T) {
	s := mustOpenAPI(t, nil)
	msgs := userMsgs("Hi")
	with := func(kv ...any) map[string]any {
		b := map[string]any{"messages": msgs}
		for i := 0; i+1 < len(kv); i += 2 {
			b[kv[i].(string)] = kv[i+1]
		}
		return b
	}
	cases := []struct {
		name  string
		body  any
		field string
	}{
		{"no messages", map[string]any{"model": "x"}, "messages"},
		{"messages not an array", map[string]any{"messages": "hi"}, "messages"},
		{"role missing", map[string]any{"messages": []map[string]any{{"content": "hi"}}}, "messages[0].role"},
		{"role tool without a call", map[string]any{"messages": []map[string]any{{"role": "tool", "content": "hi"}}}, "messages[0].tool_call_id"},
		{"role tool unknown call", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}, {"role": "tool", "content": "hi", "tool_call_id": "call_x"}}}, "messages[1].tool_call_id"},
		{"content a number", map[string]any{"messages": []map[string]any{{"role": "user", "content": 5}}}, "messages[0].content"},
		{"content missing", map[string]any{"messages": []map[string]any{{"role": "user"}}}, "messages[0].content"},
		{"image part", map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": "x"}}}}}}, "messages[0].content[0]"},
		{"content empty", map[string]any{"messages": []map[string]any{{"role": "user", "content": ""}}}, "messages[0].content"},
		{"content no parts", map[string]any{"messages": []map[string]any{{"role": "user", "content": []any{}}}}, "messages[0].content"},
		{"content an empty part", map[string]any{"messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": []map[string]any{{"type": "text", "text": ""}}}}}, "messages[1].content"},
		{"n 2", with("n", 2), "n"},
		{"top_logprobs without logprobs", with("top_logprobs", 2), "top_logprobs"},
		{"top_logprobs huge", with("logprobs", true, "top_logprobs", 99), "top_logprobs"},
		{"temperature a string", with("temperature", "warm"), "temperature"},
		{"temperature too high", with("temperature", 11), "temperature"},
		{"max_tokens negative", with("max_tokens", -1), "max_tokens"},
		{"max_completion_tokens over the cap", with("max_completion_tokens", 5000), "max_completion_tokens"},
		{"max_completion_tokens -1", with("max_completion_tokens", -1), "max_completion_tokens"},
		{"json_schema with a huge integer range", with("response_format", map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "object", "properties": map[string]any{"age": map[string]any{"type": "integer", "minimum": 0, "maximum": 5e15}}}}}), "response_format.json_schema.schema"},
		{"presence_penalty huge", with("presence_penalty", 1e9), "presence_penalty"},
		{"seed a float", with("seed", 1.5), "seed"},
		{"stop a number", with("stop", 3), "stop"},
		{"stop too long", with("stop", strings.Repeat("x", 300)), "stop"},
		{"response_format unknown", with("response_format", map[string]any{"type": "yaml"}), "response_format.type"},
		{"json_schema without schema", with("response_format", map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x"}}), "response_format.json_schema.schema"},
		{"grammar and schema", with("grammar", `root ::= "a"`, "response_format", map[string]any{"type": "json_object"}), "grammar"},
		{"grammar no token can start", with("grammar", "root ::= [\\x00]"), "grammar"},
		{"tools", with("tools", []map[string]any{{"type": "function"}}), "tools[0].function"},
		{"logit_bias", with("logit_bias", map[string]any{"1": 5}), "logit_bias"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := wantFieldError(t, post(t, s.base+"/v1/chat/completions", c.body), http.StatusBadRequest, c.field)
			if e.Error.Code != "invalid" {
				t.Fatalf("code %q", e.Error.Code)
			}
		})
	}
	// Streamed requests are validated before the stream starts.
	wantFieldError(t, post(t, s.base+"/v1/chat/completions", with("stream", true, "top_p", -1)), http.StatusBadRequest, "top_p")
	// The server still answers.
	if c := chatComplete(t, s, with("max_tokens", 3)); c.Usage.CompletionTokens == 0 {
		t.Fatal("no reply after the bad requests")
	}
}

func TestOpenAIModels(t *testing.T) {
	s := mustOpenAPI(t, nil)
	res, err := http.Get(s.base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	decodeBody(t, res, http.StatusOK, &list)
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != s.engine.Info().Name || list.Data[0].Object != "model" || list.Data[0].Created == 0 {
		t.Fatalf("models %+v", list)
	}
	one, err := http.Get(s.base + "/v1/models/" + list.Data[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	one.Body.Close()
	missing, err := http.Get(s.base + "/v1/models/gpt-9")
	if err != nil {
		t.Fatal(err)
	}
	missing.Body.Close()
	if one.StatusCode != 200 || missing.StatusCode != 404 {
		t.Fatalf("model by id: %d, unknown model: %d", one.StatusCode, missing.StatusCode)
	}
	// The completion names the same model.
	if c := chatComplete(t, s, map[string]any{"messages": userMsgs("Hi"), "max_tokens": 2}); c.Model != list.Data[0].ID {
		t.Fatalf("completion model %q, /v1/models says %q", c.Model, list.Data[0].ID)
	}
}
