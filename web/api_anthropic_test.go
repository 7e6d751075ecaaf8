package web_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/web"
)

type antUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

type antBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	Signature *string         `json:"signature"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
}

type antMessage struct {
	ID           string     `json:"id"`
	Type         string     `json:"type"`
	Role         string     `json:"role"`
	Model        string     `json:"model"`
	Content      []antBlock `json:"content"`
	StopReason   *string    `json:"stop_reason"`
	StopSequence *string    `json:"stop_sequence"`
	Usage        antUsage   `json:"usage"`
}

type antEvent struct {
	name         string
	Type         string          `json:"type"`
	Message      *antMessage     `json:"message"`
	Index        *int            `json:"index"`
	ContentBlock *antBlock       `json:"content_block"`
	Delta        json.RawMessage `json:"delta"`
	Usage        *antUsage       `json:"usage"`
	Error        *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// antHeaders are the headers Anthropic's SDKs send (the key as x-api-key).
func antHeaders(key string) []string {
	return []string{"x-api-key", key, "anthropic-version", "2023-06-01"}
}

func antCreate(tb testing.TB, s *stack, body map[string]any, hdr ...string) antMessage {
	tb.Helper()
	var m antMessage
	decodeBody(tb, post(tb, s.base+"/v1/messages", body, hdr...), http.StatusOK, &m)
	if m.Type != "message" || m.Role != "assistant" || !strings.HasPrefix(m.ID, "msg_") || m.StopReason == nil {
		tb.Fatalf("message %+v", m)
	}
	return m
}

// readAntEvents reads Anthropic's server-sent events: "event: NAME" and
// "data: JSON" lines, then an empty line; the data's type must be NAME.
func readAntEvents(tb testing.TB, r io.Reader) []antEvent {
	tb.Helper()
	br := bufio.NewReader(r)
	var out []antEvent
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			return out
		}
		name, ok := strings.CutPrefix(line, "event: ")
		if err != nil || !ok {
			tb.Fatalf("event %d: line %q (%v)", len(out), line, err)
		}
		data, err := br.ReadString('\n')
		payload, ok := strings.CutPrefix(data, "data: ")
		if err != nil || !ok {
			tb.Fatalf("event %d: data line %q (%v)", len(out), data, err)
		}
		if blank, _ := br.ReadString('\n'); blank != "\n" {
			tb.Fatalf("event %d: want an empty line after it, got %q", len(out), blank)
		}
		ev := antEvent{name: strings.TrimSuffix(name, "\n")}
		if err := json.Unmarshal([]byte(payload), &ev); err != nil || ev.Type != ev.name {
			tb.Fatalf("event %d %q: %s (%v)", len(out), ev.name, payload, err)
		}
		out = append(out, ev)
	}
}

// antAccumulate builds the message a stream describes, as the SDKs'
// accumulators do, checking the events' order on the way.
func antAccumulate(tb testing.TB, events []antEvent) antMessage {
	tb.Helper()
	if len(events) < 4 || events[0].Type != "message_start" || events[len(events)-1].Type != "message_stop" {
		tb.Fatalf("events %+v: want message_start ... message_stop", events)
	}
	m := *events[0].Message
	open := false
	for _, ev := range events[1 : len(events)-1] {
		switch ev.Type {
		case "ping":
		case "content_block_start":
			if open || *ev.Index != len(m.Content) {
				tb.Fatalf("content_block_start %+v with a block open or at the wrong index", ev)
			}
			m.Content, open = append(m.Content, *ev.ContentBlock), true
		case "content_block_delta":
			var d struct {
				Type, Text, Thinking string
				PartialJSON          string `json:"partial_json"`
			}
			json.Unmarshal(ev.Delta, &d)
			b := &m.Content[len(m.Content)-1]
			switch {
			case !open || *ev.Index != len(m.Content)-1:
				tb.Fatalf("content_block_delta %+v outside its block", ev)
			case d.Type == "text_delta" && b.Type == "text":
				b.Text += d.Text
			case d.Type == "thinking_delta" && b.Type == "thinking":
				b.Thinking += d.Thinking
			case d.Type == "input_json_delta" && b.Type == "tool_use":
				if string(b.Input) == "{}" {
					b.Input = nil // the start's empty input, then the whole input in pieces
				}
				b.Input = append(b.Input, d.PartialJSON...)
			default:
				tb.Fatalf("content_block_delta %+v in a %s block", ev, b.Type)
			}
		case "content_block_stop":
			if !open || *ev.Index != len(m.Content)-1 {
				tb.Fatalf("content_block_stop %+v", ev)
			}
			open = false
		case "message_delta":
			if open {
				tb.Fatal("message_delta with a content block open")
			}
			var d struct {
				StopReason   *string `json:"stop_reason"`
				StopSequence *string `json:"stop_sequence"`
			}
			json.Unmarshal(ev.Delta, &d)
			m.StopReason, m.StopSequence, m.Usage = d.StopReason, d.StopSequence, *ev.Usage
		default:
			tb.Fatalf("unexpected event %+v", ev)
		}
	}
	return m
}

func antStream(tb testing.TB, s *stack, body map[string]any) []antEvent {
	tb.Helper()
	body["stream"] = true
	res := post(tb, s.base+"/v1/messages", body)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		tb.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	return readAntEvents(tb, res.Body)
}

func antCount(tb testing.TB, s *stack, body map[string]any) int {
	tb.Helper()
	var c struct {
		InputTokens int `json:"input_tokens"`
	}
	decodeBody(tb, post(tb, s.base+"/v1/messages/count_tokens", body), http.StatusOK, &c)
	return c.InputTokens
}

// TestAnthropicMessages: a reply, the same reply streamed (the events
// accumulate to the same message), count_tokens against usage, and the next
// turn evaluating only what is new.
func TestAnthropicMessages(t *testing.T) {
	s := mustOpenAPI(t, nil)
	msgs := []map[string]any{{"role": "user", "content": "Tell me about a cat."}}
	body := func() map[string]any {
		return map[string]any{"model": "claude-x", "max_tokens": 12, "temperature": 0, "system": "You tell stories.", "messages": msgs,
			"metadata": map[string]any{"user_id": "u1"}}
	}
	m := antCreate(t, s, body())
	if *m.StopReason != "max_tokens" || m.StopSequence != nil || len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text == "" {
		t.Fatalf("message %+v", m)
	}
	u := m.Usage
	if u.OutputTokens != 12 || u.InputTokens+u.CacheReadInputTokens < 5 || u.CacheCreationInputTokens != 0 {
		t.Fatalf("usage %+v", u)
	}
	prompt := u.InputTokens + u.CacheReadInputTokens
	if n := antCount(t, s, body()); n != prompt {
		t.Fatalf("count_tokens %d, usage says %d (%+v)", n, prompt, u)
	}

	events := antStream(t, s, body())
	if events[1].Type != "ping" || events[0].Message.StopReason != nil || len(events[0].Message.Content) != 0 {
		t.Fatalf("stream starts %+v %+v", events[0], events[1])
	}
	got := antAccumulate(t, events)
	got.ID, m.ID = "", ""
	m.Usage, got.Usage = antUsage{}, antUsage{} // the second request reads the first one's cache
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("streamed message %+v, whole %+v", got, m)
	}
	if su := events[len(events)-2].Usage; su.OutputTokens != 12 || su.InputTokens+su.CacheReadInputTokens != prompt || su.CacheReadInputTokens < prompt-1 {
		t.Fatalf("streamed usage %+v: want the prompt (%d tokens) read from the cache", su, prompt)
	}

	// The next turn, resent whole: its prompt is the last one, the reply
	// and the new message; only about the new part is evaluated.
	msgs = append(msgs, map[string]any{"role": "assistant", "content": []map[string]any{{"type": "text", "text": m.Content[0].Text}}},
		map[string]any{"role": "user", "content": []map[string]any{{"type": "text", "text": "And then?"}}})
	m2 := antCreate(t, s, body())
	prompt2 := m2.Usage.InputTokens + m2.Usage.CacheReadInputTokens
	if fresh := prompt2 - prompt - 12; m2.Usage.InputTokens > fresh+4 {
		t.Fatalf("second turn evaluated %d tokens, %d of them new (usage %+v)", m2.Usage.InputTokens, fresh, m2.Usage)
	}
	if n := antCount(t, s, body()); n != prompt2 {
		t.Fatalf("count_tokens %d, usage says %d", n, prompt2)
	}
}

// TestAnthropicStopSequence: a stop sequence the greedy reply reaches ends
// it with stop_reason stop_sequence, naming it, streamed or not.
func TestAnthropicStopSequence(t *testing.T) {
	s := mustOpenAPI(t, nil)
	body := func() map[string]any {
		return map[string]any{"max_tokens": 24, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "Tell me about a dog."}}}
	}
	full := antCreate(t, s, body()).Content[0].Text
	words := strings.Fields(full)
	if len(words) < 3 {
		t.Fatalf("reply %q too short to pick a stop from", full)
	}
	stop := words[2]
	b := body()
	b["stop_sequences"] = []string{"never-in-a-story", stop}
	m := antCreate(t, s, b)
	want := full[:strings.Index(full, stop)]
	if *m.StopReason != "stop_sequence" || m.StopSequence == nil || *m.StopSequence != stop || len(m.Content) != 1 || m.Content[0].Text != want {
		t.Fatalf("message %+v: want %q ended by %q", m, want, stop)
	}
	got := antAccumulate(t, antStream(t, s, b))
	if *got.StopReason != "stop_sequence" || *got.StopSequence != stop || got.Content[0].Text != want {
		t.Fatalf("streamed %+v", got)
	}
}

// TestAnthropicVolatileSystemBlock: Claude Code's billing header, a first
// system block that changes on every request, is dropped: the next request
// reads the whole prompt from the cache, and the prompt is the one without
// the header.
func TestAnthropicVolatileSystemBlock(t *testing.T) {
	s := mustOpenAPI(t, nil)
	msgs := []map[string]any{{"role": "user", "content": "Tell me about a frog."}}
	for i, system := range []any{
		[]map[string]any{{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch=%05x;"},
			{"type": "text", "text": "You tell stories about ponds.", "cache_control": map[string]any{"type": "ephemeral"}}},
		"x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch=%05x;\nYou tell stories about ponds.",
	} {
		var prompt int
		for turn := range 3 {
			sys := system
			if blocks, ok := system.([]map[string]any); ok {
				first := map[string]any{"type": "text", "text": fmt.Sprintf(blocks[0]["text"].(string), 1000*i+turn)}
				sys = []map[string]any{first, blocks[1]}
			} else {
				sys = fmt.Sprintf(system.(string), 1000*i+turn)
			}
			b := map[string]any{"max_tokens": 4, "temperature": 0, "system": sys, "messages": msgs}
			m := antCreate(t, s, b)
			p := m.Usage.InputTokens + m.Usage.CacheReadInputTokens
			if turn > 0 && (p != prompt || m.Usage.InputTokens > 1) {
				t.Fatalf("system %d, request %d: usage %+v; want the same %d-token prompt read from the cache", i, turn, m.Usage, prompt)
			}
			prompt = p
		}
		plain := antCount(t, s, map[string]any{"system": "You tell stories about ponds.", "messages": msgs})
		if plain != prompt {
			t.Fatalf("system %d: the prompt has %d tokens, without the header %d", i, prompt, plain)
		}
	}
}

// TestAnthropicErrors: bad requests are 400s in Anthropic's error shape
// whose message names the field; a wrong key is a 401 in the same shape.
func TestAnthropicErrors(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.APIKey, c.MaxTokensCap = "k3y", 40000 })
	user := []map[string]any{{"role": "user", "content": "Hi"}}
	many := make([]map[string]any, 10000)
	for i := range many {
		many[i] = map[string]any{"type": "text", "text": "a"}
	}
	manyMsgs := make([]map[string]any, 10000)
	for i := range manyMsgs {
		manyMsgs[i] = map[string]any{"role": []string{"user", "assistant"}[i%2], "content": "a"}
	}
	cases := []struct {
		name, field string
		body        any
	}{
		{"no max_tokens", "max_tokens", map[string]any{"messages": user}},
		{"max_tokens 0", "max_tokens", map[string]any{"max_tokens": 0, "messages": user}},
		{"bad temperature", "temperature", map[string]any{"max_tokens": 4, "temperature": -1, "messages": user}},
		{"top_k a string", "top_k", map[string]any{"max_tokens": 4, "top_k": "x", "messages": user}},
		{"no messages", "messages", map[string]any{"max_tokens": 4, "messages": []any{}}},
		{"bad role", "messages[0].role", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "tool", "content": "x"}}}},
		{"image block that is no image", "messages[0].content[1]", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{
			{"type": "text", "text": "What is this?"}, {"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": "iVBO"}}}}}}},
		{"unknown block", "messages[0].content[0].type", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "banana"}}}}}},
		{"block not an object", "messages[0].content[0]", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []any{7}}}}},
		{"text block without text", "messages[0].content[0].text", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text"}}}}}},
		{"tool_result answering nothing", "messages[0].content[0].tool_use_id", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": "t1", "content": "4"}}}}}},
		{"tool_use from the user", "messages[0].content[0].type", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "tool_use", "id": "t1", "name": "f", "input": map[string]any{}}}}}}},
		{"tool_use input not an object", "messages[1].content[0].input", map[string]any{"max_tokens": 4, "messages": append(user,
			map[string]any{"role": "assistant", "content": []map[string]any{{"type": "tool_use", "id": "t1", "name": "f", "input": "x"}}}, user[0])}},
		{"10,000 blocks", "messages[0].content", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": many}}}},
		{"10,000 messages", "messages[4096].content", map[string]any{"max_tokens": 4, "messages": manyMsgs}},
		{"empty user message", "messages[0].content", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": ""}}}},
		{"content a number", "messages[0].content", map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": 5}}}},
		{"ends with the assistant", "messages[1].role", map[string]any{"max_tokens": 4, "messages": append(user, map[string]any{"role": "assistant", "content": "Once"})}},
		{"system image block", "system[0].type", map[string]any{"max_tokens": 4, "system": []map[string]any{{"type": "image"}}, "messages": user}},
		{"system a number", "system", map[string]any{"max_tokens": 4, "system": 3, "messages": user}},
		{"a server tool", "tools[0].type", map[string]any{"max_tokens": 4, "messages": user, "tools": []map[string]any{{"type": "bash_20250124", "name": "bash"}}}},
		{"a tool without input_schema", "tools[0].input_schema", map[string]any{"max_tokens": 4, "messages": user, "tools": []map[string]any{{"name": "f"}}}},
		{"a tool with a bad name", "tools[0].name", map[string]any{"max_tokens": 4, "messages": user, "tools": []map[string]any{{"name": "f g", "input_schema": map[string]any{"type": "object"}}}}},
		{"a recursive input_schema", "tools[0].input_schema", map[string]any{"max_tokens": 4, "messages": user, "tools": []map[string]any{{"name": "f",
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"$ref": "#"}}}}}}},
		{"tool_choice any without tools", "tool_choice", map[string]any{"max_tokens": 4, "messages": user, "tool_choice": map[string]any{"type": "any"}}},
		{"tool_choice of an unknown type", "tool_choice.type", map[string]any{"max_tokens": 4, "messages": user, "tool_choice": map[string]any{"type": "some"}}},
		{"tool_choice naming no tool", "tool_choice.name", map[string]any{"max_tokens": 4, "messages": user, "tool_choice": map[string]any{"type": "tool", "name": "g"},
			"tools": []map[string]any{{"name": "f", "input_schema": map[string]any{"type": "object"}}}}},
		{"metadata not an object", "metadata", map[string]any{"max_tokens": 4, "messages": user, "metadata": "u1"}},
		{"stop_sequences a number", "stop_sequences", map[string]any{"max_tokens": 4, "messages": user, "stop_sequences": 3}},
	}
	for _, c := range cases {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			if path != "/v1/messages" && (strings.Contains(c.name, "max_tokens") || c.field == "temperature" || c.field == "top_k" || c.field == "stop_sequences") {
				continue // count_tokens reads no sampling parameters
			}
			res := post(t, s.base+path, c.body, antHeaders("k3y")...)
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			decodeBody(t, res, http.StatusBadRequest, &e)
			if e.Type != "error" || e.Error.Type != "invalid_request_error" || !strings.HasPrefix(e.Error.Message, c.field) {
				t.Errorf("%s %s: error %+v, want an invalid_request_error naming %s", c.name, path, e, c.field)
			}
		}
	}

	for _, hdr := range [][]string{nil, antHeaders("wrong"), {"Authorization", "Bearer wrong"}} {
		var e struct {
			Type  string                `json:"type"`
			Error struct{ Type string } `json:"error"`
		}
		decodeBody(t, post(t, s.base+"/v1/messages", map[string]any{"max_tokens": 4, "messages": user}, hdr...), http.StatusUnauthorized, &e)
		if e.Type != "error" || e.Error.Type != "authentication_error" {
			t.Errorf("headers %q: error %+v", hdr, e)
		}
	}
	// The key as a bearer token works too.
	antCreate(t, s, map[string]any{"max_tokens": 2, "messages": user}, "Authorization", "Bearer k3y")

	// A max_tokens past the reply cap (40,000 here) or the context (512) is
	// an upper bound the server lowers, as Claude-style clients send 32,000:
	// to the cap, and then to half the context.
	for _, n := range []int{32000, 64000} {
		m := antCreate(t, s, map[string]any{"max_tokens": n, "messages": user}, antHeaders("k3y")...)
		if m.Usage.OutputTokens > 256 {
			t.Fatalf("max_tokens %d on a 512-token context: %+v", n, m)
		}
	}
}

// TestAnthropicStreamEnds: a stream that fails after it began ends with an
// "error" event in Anthropic's shape (no message_stop); a client that goes
// away mid-stream frees its slot; a prompt over the server's cap, or over
// the context, is Anthropic's 400 "prompt is too long" (before anything
// reaches the engine).
func TestAnthropicStreamEnds(t *testing.T) {
	long := map[string]any{"max_tokens": 400, "stream": true, "messages": []map[string]any{{"role": "user", "content": "Hi"}}}
	t.Run("error after start", func(t *testing.T) {
		s := mustOpenAPI(t, nil)
		res := post(t, s.base+"/v1/messages", long)
		first := make([]byte, 1)
		if _, err := io.ReadFull(res.Body, first); err != nil {
			t.Fatal(err)
		}
		s.engine.Close()
		events := readAntEvents(t, io.MultiReader(strings.NewReader(string(first)), res.Body))
		last := events[len(events)-1]
		if last.Type != "error" || last.Error == nil || last.Error.Type != "overloaded_error" || !strings.Contains(last.Error.Message, "shutting down") {
			t.Fatalf("last event %+v", last)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		s := mustOpenAPI(t, nil)
		for range 3 { // more than the stack's 2 slots: each must be freed
			res := post(t, s.base+"/v1/messages", long)
			br := bufio.NewReader(res.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(line, "text_delta") {
					break
				}
			}
			res.Body.Close()
		}
		m := antCreate(t, s, map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": "Hi"}}})
		if m.Usage.OutputTokens != 4 {
			t.Fatalf("after three clients left: %+v", m)
		}
	})
	t.Run("prompt over the cap", func(t *testing.T) {
		s := mustOpenAPI(t, func(c *web.Config) { c.MaxPromptTokens = 20 })
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		body := map[string]any{"max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": strings.Repeat("The cat sat on the mat. ", 10)}}}
		decodeBody(t, post(t, s.base+"/v1/messages", body), http.StatusBadRequest, &e)
		if e.Type != "error" || e.Error.Type != "invalid_request_error" || !regexp.MustCompile(`^prompt is too long: \d+ tokens > 20 maximum \(`).MatchString(e.Error.Message) ||
			s.engine.Stats().PromptEvaluated != 0 {
			t.Fatalf("error %+v, stats %+v", e, s.engine.Stats())
		}
	})
	// Over the context window (512 tokens; no cap): the same error, Anthropic's
	// answer to a prompt too long for the model, streamed or not.
	t.Run("prompt over the context", func(t *testing.T) {
		s := mustOpenAPI(t, nil)
		for _, stream := range []bool{false, true} {
			var e struct {
				Type  string
				Error struct{ Type, Message string }
			}
			body := map[string]any{"max_tokens": 4, "stream": stream, "messages": []map[string]any{{"role": "user", "content": strings.Repeat("The cat sat on the mat. ", 80)}}}
			decodeBody(t, post(t, s.base+"/v1/messages", body), http.StatusBadRequest, &e)
			if e.Type != "error" || e.Error.Type != "invalid_request_error" || !regexp.MustCompile(`^prompt is too long: \d+ tokens > \d+ maximum \(`).MatchString(e.Error.Message) {
				t.Fatalf("stream %v: error %+v", stream, e)
			}
		}
	})
}

// TestAnthropicModels: GET /v1/models answers Anthropic's clients (they
// send anthropic-version) with Anthropic's page of models and errors, and
// everyone else with OpenAI's list.
func TestAnthropicModels(t *testing.T) {
	s := mustOpenAPI(t, nil)
	get := func(path string, hdr ...string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, s.base+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		return res
	}
	var page struct {
		Data []struct {
			Type, ID    string
			DisplayName string `json:"display_name"`
			CreatedAt   string `json:"created_at"`
		}
		HasMore bool   `json:"has_more"`
		FirstID string `json:"first_id"`
	}
	decodeBody(t, get("/v1/models", antHeaders("")...), http.StatusOK, &page)
	if len(page.Data) != 1 || page.Data[0].Type != "model" || page.Data[0].ID == "" || page.FirstID != page.Data[0].ID || page.HasMore || page.Data[0].CreatedAt == "" {
		t.Fatalf("page %+v", page)
	}
	var one struct{ Type, ID string }
	decodeBody(t, get("/v1/models/"+page.Data[0].ID, antHeaders("")...), http.StatusOK, &one)
	if one.Type != "model" || one.ID != page.Data[0].ID {
		t.Fatalf("model %+v", one)
	}
	var e struct {
		Type  string
		Error struct{ Type string }
	}
	decodeBody(t, get("/v1/models/nope", antHeaders("")...), http.StatusNotFound, &e)
	if e.Type != "error" || e.Error.Type != "not_found_error" {
		t.Fatalf("error %+v", e)
	}
	var list struct{ Object string }
	decodeBody(t, get("/v1/models"), http.StatusOK, &list)
	if list.Object != "list" {
		t.Fatalf("OpenAI's list %+v", list)
	}
}

// TestAnthropicKeepAlivePings: a stream waiting for its first token (here
// queued behind another reply on the one slot) gets ping events while
// nothing else is written, and still accumulates to the whole message.
func TestAnthropicKeepAlivePings(t *testing.T) {
	s := openStack(t, stackOpts{parallel: 1, maxTokens: 24, maxTokensCap: 480, tokenizer: true,
		cfg: func(c *web.Config) { c.PongWait = 10 * time.Millisecond }, // pings every 9 ms of silence
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
	first := post(t, s.base+"/v1/messages", map[string]any{"max_tokens": 480, "stream": true, "temperature": 0,
		"messages": []map[string]any{{"role": "user", "content": "Once upon a time"}}})
	br := bufio.NewReader(first.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first reply holds the slot
		t.Fatal(err)
	}
	body := map[string]any{"max_tokens": 8, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "Hi"}}}
	events := antStream(t, s, body)
	pings := 0
	for _, ev := range events {
		if ev.Type == "ping" {
			pings++
		}
	}
	if pings < 2 {
		t.Fatalf("%d pings while queued behind a 480-token reply: want the first and keep-alives", pings)
	}
	got := antAccumulate(t, events)
	whole := antCreate(t, s, map[string]any{"max_tokens": 8, "temperature": 0, "messages": body["messages"]})
	if got.Content[0].Text != whole.Content[0].Text {
		t.Fatalf("streamed %q, whole %q", got.Content[0].Text, whole.Content[0].Text)
	}
	io.Copy(io.Discard, br)
}

// TestAnthropicThinking: a reasoning model (a scripted Qwen3 with Qwen3's
// own template) answers with a thinking block, then the text; streamed, a
// thinking block of thinking_delta pieces comes first; count_tokens agrees
// with usage under each thinking switch; the thinking block sent back is
// accepted as the turn's reasoning, and bad thinking values are 400s.
func TestAnthropicThinking(t *testing.T) {
	s := openStack(t, stackOpts{model: qwen3Model(t), maxTokens: 64, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	body := map[string]any{"max_tokens": 64, "messages": msgs, "thinking": map[string]any{"type": "enabled", "budget_tokens": 48}}
	m := antCreate(t, s, body)
	if len(m.Content) != 2 || m.Content[0].Type != "thinking" || m.Content[0].Thinking != qwenThought || m.Content[0].Signature == nil ||
		m.Content[1].Type != "text" || m.Content[1].Text != qwenAnswer || *m.StopReason != "end_turn" {
		t.Fatalf("message %+v", m)
	}
	got := antAccumulate(t, antStream(t, s, body))
	if len(got.Content) != 2 || got.Content[0].Thinking != qwenThought || got.Content[1].Text != qwenAnswer {
		t.Fatalf("streamed %+v", got)
	}
	for _, th := range []map[string]any{{"type": "enabled"}, {"type": "disabled"}, {"type": "adaptive"}} {
		b := map[string]any{"max_tokens": 64, "messages": msgs, "thinking": th}
		r := antCreate(t, s, b)
		delete(b, "max_tokens")
		if n := antCount(t, s, b); n != r.Usage.InputTokens+r.Usage.CacheReadInputTokens {
			t.Fatalf("thinking %v: count_tokens %d, usage %+v", th, n, r.Usage)
		}
	}
	next := append(msgs, map[string]any{"role": "assistant", "content": []map[string]any{
		{"type": "thinking", "thinking": qwenThought, "signature": ""}, {"type": "text", "text": qwenAnswer}}},
		map[string]any{"role": "user", "content": "And you?"})
	antCreate(t, s, map[string]any{"max_tokens": 64, "messages": next})
	for field, th := range map[string]map[string]any{"thinking.type": {"type": "on"}, "thinking.budget_tokens": {"type": "enabled", "budget_tokens": 0}} {
		var e struct {
			Error struct{ Type, Message string }
		}
		decodeBody(t, post(t, s.base+"/v1/messages", map[string]any{"max_tokens": 8, "messages": msgs, "thinking": th}), http.StatusBadRequest, &e)
		if !strings.HasPrefix(e.Error.Message, field) {
			t.Errorf("thinking %v: %+v, want an error naming %s", th, e, field)
		}
	}
}

var antWeather = []map[string]any{{"name": "get_weather", "description": "Weather in a city",
	"input_schema": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "unit"},
		"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 16}, "unit": map[string]any{"enum": []string{"c", "f"}}}}}}

// TestAnthropicToolUse: tool_choice any (and tool, by name) makes
// stories260K call the tool: a tool_use block whose input validates,
// stop_reason tool_use; streamed, the same block with its input in
// input_json_delta pieces; count_tokens counts the tools; the call and its
// tool_result go back in the history and the reply continues.
func TestAnthropicToolUse(t *testing.T) {
	s := openToolStack(t)
	msgs := []map[string]any{{"role": "user", "content": "Weather in Paris?"}}
	body := func(choice map[string]any) map[string]any {
		return map[string]any{"max_tokens": 200, "temperature": 0, "system": "You call tools.", "messages": msgs, "tools": antWeather, "tool_choice": choice}
	}
	for _, choice := range []map[string]any{{"type": "any"}, {"type": "tool", "name": "get_weather"}} {
		m := antCreate(t, s, body(choice))
		if *m.StopReason != "tool_use" || len(m.Content) != 1 {
			t.Fatalf("tool_choice %v: message %+v", choice, m)
		}
		use := m.Content[0]
		if use.Type != "tool_use" || use.ID == "" || use.Name != "get_weather" {
			t.Fatalf("block %+v", use)
		}
		checkWeatherArgs(t, string(use.Input))
		if n := antCount(t, s, body(choice)); n != m.Usage.InputTokens+m.Usage.CacheReadInputTokens {
			t.Fatalf("count_tokens %d, usage %+v", n, m.Usage)
		}

		events := antStream(t, s, body(choice))
		got := antAccumulate(t, events)
		pieces := 0
		for _, ev := range events {
			if strings.Contains(string(ev.Delta), "input_json_delta") {
				pieces++
			}
		}
		var a, b any
		json.Unmarshal(got.Content[0].Input, &a)
		json.Unmarshal(use.Input, &b)
		if *got.StopReason != "tool_use" || len(got.Content) != 1 || got.Content[0].Name != use.Name || !reflect.DeepEqual(a, b) || pieces < 3 {
			t.Fatalf("streamed %+v in %d pieces, whole %+v", got, pieces, m)
		}
	}

	m := antCreate(t, s, body(map[string]any{"type": "any"}))
	use := m.Content[0]
	msgs = append(msgs,
		map[string]any{"role": "assistant", "content": []map[string]any{{"type": "tool_use", "id": use.ID, "name": use.Name, "input": use.Input}}},
		map[string]any{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": use.ID, "content": `{"temperature": 21}`}}})
	// tool_choice auto: the tools stay in the prompt (none would leave them
	// out, and the prompt would change from its start).
	next := antCreate(t, s, body(map[string]any{"type": "auto"}))
	if len(next.Content) == 0 {
		t.Fatalf("after the result: %+v", next)
	}
	if next.Usage.CacheReadInputTokens < m.Usage.InputTokens+m.Usage.CacheReadInputTokens-4 {
		t.Fatalf("after the result: usage %+v, want the call's prompt (%+v) read from the cache", next.Usage, m.Usage)
	}
}

// TestAnthropicSystemMessages: a system message after the first user turn
// (Claude Code sends its environment block there, and one at the end) is
// accepted as Anthropic accepts it, and reaches the prompt: on the plain
// transcript, and on a model whose template raises on a system message past
// the first (rendered by its family then). The next turn, resent with the
// system message where it was, reads the earlier prompt from the cache.
func TestAnthropicSystemMessages(t *testing.T) {
	strict := testmodel.Scripted(t, &synth.Script{
		Template: "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('System message must be at the beginning.') }}{% endif %}" +
			"<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
		Control: []string{"<|im_start|>", "<|im_end|>"},
		After:   "\n",
		Reply:   "Done.<|im_end|>",
	})
	for _, model := range []string{"", strict} {
		s := openStack(t, stackOpts{model: model, parallel: 1, contextLen: 1024, maxTokens: 8, tokenizer: true, options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
		env := map[string]any{"role": "system", "content": []map[string]any{{"type": "text", "text": "Working directory: /home/ann/pond. Platform: linux."}}}
		user := map[string]any{"role": "user", "content": "Tell me about a frog."}
		body := func(msgs ...map[string]any) map[string]any {
			return map[string]any{"max_tokens": 6, "temperature": 0, "system": "You tell stories.", "messages": msgs}
		}
		without := antCount(t, s, body(user))
		with := antCount(t, s, body(user, env))
		if with <= without+5 {
			t.Fatalf("model %q: %d prompt tokens with the system message after the user's, %d without: it did not reach the prompt", model, with, without)
		}
		m := antCreate(t, s, body(user, env))
		if got := m.Usage.InputTokens + m.Usage.CacheReadInputTokens; got != with {
			t.Fatalf("model %q: usage %+v, count_tokens %d", model, m.Usage, with)
		}
		reply := map[string]any{"role": "assistant", "content": []map[string]any{{"type": "text", "text": m.Content[0].Text}}}
		next := antCreate(t, s, body(user, env, reply, map[string]any{"role": "user", "content": "And then?"}, env))
		if next.Usage.CacheReadInputTokens < with-2 {
			t.Fatalf("model %q: second turn usage %+v; want the first prompt (%d tokens) read from the cache", model, next.Usage, with)
		}
		// A conversation whose last turn before the system message is the
		// assistant's is still refused, naming that message.
		var e struct {
			Error struct{ Type, Message string }
		}
		decodeBody(t, post(t, s.base+"/v1/messages", body(user, reply, env)), http.StatusBadRequest, &e)
		if !strings.HasPrefix(e.Error.Message, "messages[1].role") {
			t.Fatalf("model %q: ends with the assistant's turn: %+v, want an error naming messages[1].role", model, e)
		}
	}
}

// TestAnthropicLargeSchemaBounds: a tool whose schema bounds a string far
// past what a grammar can count (Claude Code's Write tool: maxLength
// 524288) is accepted, its bound read as none (the model may write on);
// a minimum past the cap, which no grammar can enforce, is still refused.
func TestAnthropicLargeSchemaBounds(t *testing.T) {
	s := openToolStack(t)
	write := func(content map[string]any) []map[string]any {
		return []map[string]any{{"name": "Write", "description": "Writes a file",
			"input_schema": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"file_path", "content"},
				"properties": map[string]any{"file_path": map[string]any{"type": "string", "maxLength": 12}, "content": content}}}}
	}
	body := map[string]any{"max_tokens": 60, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "Write a story to a file."}},
		"tools": write(map[string]any{"type": "string", "maxLength": 524288}), "tool_choice": map[string]any{"type": "any"}}
	// Forced to call Write, stories260K writes its content until max_tokens:
	// the grammar lets the string run on.
	m := antCreate(t, s, body)
	if *m.StopReason != "max_tokens" || m.Usage.OutputTokens != 60 {
		t.Fatalf("message %+v: want the call's content cut at max_tokens", m)
	}
	if n := antCount(t, s, body); n != m.Usage.InputTokens+m.Usage.CacheReadInputTokens {
		t.Fatalf("count_tokens %d, usage %+v", n, m.Usage)
	}
	body["tools"] = write(map[string]any{"type": "string", "minLength": 524288})
	var e struct {
		Error struct{ Type, Message string }
	}
	decodeBody(t, post(t, s.base+"/v1/messages", body), http.StatusBadRequest, &e)
	if !strings.Contains(e.Error.Message, "minLength") {
		t.Fatalf("minLength 524288: %+v, want an error naming minLength", e)
	}
}

// TestAnthropicStructuredOutput: output_config.format with a JSON schema
// (the AI SDK's Anthropic provider and LangChain's jsonSchema method send
// it), and the beta's output_format, constrain the reply's text to JSON
// that validates, whole and streamed; a format of another type is refused
// naming it.
func TestAnthropicStructuredOutput(t *testing.T) {
	s := mustOpenAPI(t, nil)
	schema := map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "unit"},
		"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 16}, "unit": map[string]any{"enum": []string{"c", "f"}}}}
	format := map[string]any{"type": "json_schema", "schema": schema}
	for _, extra := range []map[string]any{{"output_config": map[string]any{"format": format, "effort": "low"}}, {"output_format": format}} {
		body := map[string]any{"max_tokens": 200, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "Weather in Paris?"}}}
		for k, v := range extra {
			body[k] = v
		}
		m := antCreate(t, s, body)
		if *m.StopReason != "end_turn" || len(m.Content) != 1 || m.Content[0].Type != "text" {
			t.Fatalf("%v: message %+v", extra, m)
		}
		checkWeatherArgs(t, m.Content[0].Text)
		got := antAccumulate(t, antStream(t, s, body))
		if len(got.Content) != 1 || got.Content[0].Text != m.Content[0].Text {
			t.Fatalf("%v: streamed %+v, whole %+v", extra, got, m)
		}
	}
	body := map[string]any{"max_tokens": 20, "messages": []map[string]any{{"role": "user", "content": "Hi"}},
		"output_config": map[string]any{"format": map[string]any{"type": "xml"}}}
	var e struct {
		Error struct{ Type, Message string }
	}
	decodeBody(t, post(t, s.base+"/v1/messages", body), http.StatusBadRequest, &e)
	if !strings.HasPrefix(e.Error.Message, "output_config.format.type") {
		t.Fatalf("format xml: %+v", e)
	}
}
