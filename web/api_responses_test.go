package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web"
)

type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type respItem struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Role    string `json:"role"`
	Status  string `json:"status"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
}

type respObject struct {
	ID                 string     `json:"id"`
	Object             string     `json:"object"`
	Status             string     `json:"status"`
	Model              string     `json:"model"`
	Instructions       *string    `json:"instructions"`
	PreviousResponseID *string    `json:"previous_response_id"`
	Store              bool       `json:"store"`
	MaxOutputTokens    *int       `json:"max_output_tokens"`
	Output             []respItem `json:"output"`
	Usage              *respUsage `json:"usage"`
	Conversation       *struct {
		ID string `json:"id"`
	} `json:"conversation"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
}

func (r respObject) text() string {
	var b strings.Builder
	for _, it := range r.Output {
		for _, c := range it.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

type itemsList struct {
	Object  string     `json:"object"`
	Data    []respItem `json:"data"`
	HasMore bool       `json:"has_more"`
}

type convObject struct {
	ID       string            `json:"id"`
	Object   string            `json:"object"`
	Metadata map[string]string `json:"metadata"`
	Deleted  bool              `json:"deleted"`
}

func createResponse(tb testing.TB, s *stack, body map[string]any) respObject {
	tb.Helper()
	var r respObject
	decodeBody(tb, post(tb, s.base+"/v1/responses", body), http.StatusOK, &r)
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || len(r.Output) != 1 || r.Usage == nil {
		tb.Fatalf("response %+v", r)
	}
	return r
}

// sessionOf is the session response id is in, as the server finds it (the
// id itself does not show it).
func sessionOf(tb testing.TB, s *stack, id string) string {
	tb.Helper()
	_, sess, err := s.sessions.GetResponse(context.Background(), parley.Caller{}, id)
	if err != nil {
		tb.Fatalf("response %s: %v", id, err)
	}
	if strings.Contains(id, sess.ID) {
		tb.Fatalf("response id %s shows its session %s", id, sess.ID)
	}
	return sess.ID
}

func do(tb testing.TB, method, url string, body any) *http.Response {
	tb.Helper()
	if method == http.MethodPost {
		return post(tb, url, body)
	}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { res.Body.Close() })
	return res
}

// TestResponsesChainReusesSession: previous_response_id continues the
// session, so the chained turn sees the first and evaluates only its new
// tokens; GET, input_items and DELETE see what was stored.
func TestResponsesChainReusesSession(t *testing.T) {
	s := mustOpenAPI(t, nil)
	first := createResponse(t, s, map[string]any{"input": "Once upon a time", "instructions": "You tell stories.", "max_output_tokens": 8})
	if first.Status != "completed" && first.Status != "incomplete" || first.text() == "" || first.Usage.OutputTokens == 0 ||
		first.Instructions == nil || *first.Instructions != "You tell stories." || !first.Store {
		t.Fatalf("first %+v", first)
	}
	second := createResponse(t, s, map[string]any{"input": "Then what?", "previous_response_id": first.ID, "max_output_tokens": 8})
	if second.PreviousResponseID == nil || *second.PreviousResponseID != first.ID {
		t.Fatalf("second.previous_response_id %v", second.PreviousResponseID)
	}
	if sessionOf(t, s, second.ID) != sessionOf(t, s, first.ID) {
		t.Fatalf("chained response %s left the session of %s", second.ID, first.ID)
	}
	// The chained prompt starts with the whole first turn, which is in the
	// slot's KV cache: only the new tokens are evaluated.
	if c := second.Usage.InputTokensDetails.CachedTokens; c < first.Usage.InputTokens || c >= second.Usage.InputTokens {
		t.Fatalf("cached %d of %d input tokens, want at least the first prompt's %d", c, second.Usage.InputTokens, first.Usage.InputTokens)
	}
	var got respObject
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/responses/"+second.ID, nil), http.StatusOK, &got)
	if got.ID != second.ID || got.text() != second.text() || got.Usage.InputTokens != second.Usage.InputTokens {
		t.Fatalf("GET %+v, want %+v", got, second)
	}
	var in itemsList
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/responses/"+second.ID+"/input_items", nil), http.StatusOK, &in)
	if len(in.Data) != 1 || in.Data[0].Role != "user" || in.Data[0].Content[0].Text != "Then what?" {
		t.Fatalf("input_items %+v", in)
	}

	// A fork from the first response: a new session with the first turn only.
	fork := createResponse(t, s, map[string]any{"input": "And later?", "previous_response_id": first.ID, "max_output_tokens": 4})
	if sessionOf(t, s, fork.ID) == sessionOf(t, s, first.ID) {
		t.Fatalf("a fork from an older response stayed in its session")
	}
	// The engine finds the shared history in the original session's slot.
	if fork.Usage.InputTokensDetails.CachedTokens < first.Usage.InputTokens {
		t.Fatalf("fork cached %d tokens, want at least the first prompt's %d", fork.Usage.InputTokensDetails.CachedTokens, first.Usage.InputTokens)
	}
	var conv itemsList
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/conversations/conv_"+sessionOf(t, s, fork.ID)+"/items?order=asc", nil), http.StatusOK, &conv)
	if len(conv.Data) != 5 || conv.Data[1].Content[0].Text != "Once upon a time" || conv.Data[3].Content[0].Text != "And later?" {
		t.Fatalf("fork items %+v", conv.Data)
	}

	// store: false answers but keeps nothing.
	ns := createResponse(t, s, map[string]any{"input": "Hi", "store": false, "max_output_tokens": 4})
	do(t, http.MethodGet, s.base+"/v1/responses/"+ns.ID, nil)
	wantFieldError(t, do(t, http.MethodGet, s.base+"/v1/responses/"+ns.ID, nil), http.StatusNotFound, "")

	var del convObject
	decodeBody(t, do(t, http.MethodDelete, s.base+"/v1/responses/"+second.ID, nil), http.StatusOK, &del)
	if !del.Deleted {
		t.Fatalf("delete %+v", del)
	}
	wantFieldError(t, do(t, http.MethodGet, s.base+"/v1/responses/"+second.ID, nil), http.StatusNotFound, "")
	// The first response is the newest again, and still there.
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/responses/"+first.ID, nil), http.StatusOK, &got)
}

// sseEvent is one event of a streamed response.
type sseEvent struct {
	name string
	data map[string]any
}

func readResponseEvents(tb testing.TB, r io.Reader) []sseEvent {
	tb.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var out []sseEvent
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				tb.Fatalf("event %s: %v", name, err)
			}
			if m["type"] != name {
				tb.Fatalf("event %q carries type %v", name, m["type"])
			}
			out = append(out, sseEvent{name, m})
		case line == "":
		default:
			tb.Fatalf("unexpected line %q", line)
		}
	}
	return out
}

// checkEventOrder checks the documented sequence and sequence numbers and
// returns the concatenated deltas and the final response.
func checkEventOrder(tb testing.TB, evs []sseEvent) (string, map[string]any) {
	tb.Helper()
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	if len(evs) < len(want)+4 {
		tb.Fatalf("%d events", len(evs))
	}
	var deltas strings.Builder
	for i, ev := range evs {
		if n, _ := ev.data["sequence_number"].(float64); int(n) != i {
			tb.Fatalf("event %d (%s) has sequence_number %v", i, ev.name, ev.data["sequence_number"])
		}
		switch {
		case i < len(want):
			if ev.name != want[i] {
				tb.Fatalf("event %d is %s, want %s", i, ev.name, want[i])
			}
		case i >= len(evs)-4:
			tail := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
			w := tail[i-(len(evs)-4)]
			if ev.name != w && !(w == "response.completed" && ev.name == "response.incomplete") {
				tb.Fatalf("event %d is %s, want %s", i, ev.name, w)
			}
		default:
			if ev.name != "response.output_text.delta" {
				tb.Fatalf("event %d is %s, want a delta", i, ev.name)
			}
			deltas.WriteString(ev.data["delta"].(string))
		}
	}
	if done := evs[len(evs)-4].data["text"]; done != deltas.String() {
		tb.Fatalf("output_text.done %q, deltas %q", done, deltas.String())
	}
	return deltas.String(), evs[len(evs)-1].data["response"].(map[string]any)
}

func TestResponsesStreamEvents(t *testing.T) {
	s := mustOpenAPI(t, nil)
	res := post(t, s.base+"/v1/responses", map[string]any{"input": "Once upon a time", "stream": true, "max_output_tokens": 12})
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, type %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	text, final := checkEventOrder(t, readResponseEvents(t, res.Body))
	id, _ := final["id"].(string)
	var got respObject
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/responses/"+id, nil), http.StatusOK, &got)
	if got.text() != text || text == "" {
		t.Fatalf("stored %q, streamed %q", got.text(), text)
	}
	if got.Status != "incomplete" || got.IncompleteDetails == nil || got.IncompleteDetails.Reason != "max_output_tokens" {
		t.Fatalf("a reply cut at max_output_tokens: %+v", got)
	}
}

// TestConversationsCRUDSharesWebSocketSessions: a conversation is a
// session; one begun on the chat WebSocket continues over the Responses
// API by its id, and the WebSocket sees the turn.
func TestConversationsCRUDSharesWebSocketSessions(t *testing.T) {
	s := mustOpenAPI(t, nil)
	var conv convObject
	decodeBody(t, post(t, s.base+"/v1/conversations", map[string]any{
		"metadata": map[string]string{"topic": "cats"},
		"items":    []map[string]any{{"type": "message", "role": "user", "content": "Tell me about cats."}},
	}), http.StatusOK, &conv)
	if !strings.HasPrefix(conv.ID, "conv_") || conv.Object != "conversation" || conv.Metadata["topic"] != "cats" {
		t.Fatalf("create %+v", conv)
	}
	base := s.base + "/v1/conversations/" + conv.ID
	decodeBody(t, post(t, base, map[string]any{"metadata": map[string]string{"topic": "dogs"}}), http.StatusOK, &conv)
	var got convObject
	decodeBody(t, do(t, http.MethodGet, base, nil), http.StatusOK, &got)
	if got.Metadata["topic"] != "dogs" {
		t.Fatalf("metadata %+v", got)
	}
	var added itemsList
	decodeBody(t, post(t, base+"/items", map[string]any{"items": []map[string]any{
		{"role": "assistant", "content": []map[string]any{{"type": "output_text", "text": "Cats purr."}}},
	}}), http.StatusOK, &added)
	if len(added.Data) != 1 || added.Data[0].Role != "assistant" {
		t.Fatalf("added %+v", added)
	}
	r := createResponse(t, s, map[string]any{"input": "More!", "conversation": conv.ID, "max_output_tokens": 4})
	if r.Conversation == nil || r.Conversation.ID != conv.ID {
		t.Fatalf("conversation %+v", r.Conversation)
	}
	var items itemsList
	decodeBody(t, do(t, http.MethodGet, base+"/items?order=asc", nil), http.StatusOK, &items)
	if len(items.Data) != 4 || items.Data[2].Content[0].Text != "More!" || items.Data[3].Content[0].Text != r.text() {
		t.Fatalf("items %+v", items.Data)
	}
	var one respItem
	decodeBody(t, do(t, http.MethodGet, base+"/items/"+items.Data[1].ID, nil), http.StatusOK, &one)
	if one.Content[0].Text != "Cats purr." {
		t.Fatalf("item %+v", one)
	}
	decodeBody(t, do(t, http.MethodDelete, base+"/items/"+items.Data[1].ID, nil), http.StatusOK, &got)
	decodeBody(t, do(t, http.MethodGet, base+"/items?limit=2", nil), http.StatusOK, &items)
	if len(items.Data) != 2 || !items.HasMore || items.Data[1].Content[0].Text != "More!" {
		t.Fatalf("items after delete %+v", items)
	}

	// The chat WebSocket resumes the conversation made over HTTP ...
	ws := dial(t, s.url+"/ws?format=json&session="+conv.ID[len("conv_"):], nil)
	if m := readJSON(t, ws); m.Type != "session" || !m.Resumed || len(m.Messages) != 3 || m.Messages[1].Content != "More!" {
		t.Fatalf("resume over the WebSocket: %+v", m)
	}
	// ... and a conversation begun on the WebSocket continues over HTTP,
	// by its bare session id, on its KV cache.
	ws2 := dial(t, s.url+"/ws?format=json", nil)
	sid := readJSON(t, ws2).SessionID()
	ws2.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 5}})
	readUntilDone(t, ws2)
	r2 := createResponse(t, s, map[string]any{"input": "And then?", "conversation": sid, "max_output_tokens": 4})
	if r2.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Fatalf("a turn continuing the WebSocket's conversation reused no cache: %+v", r2.Usage)
	}
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/conversations/conv_"+sid+"/items?order=asc", nil), http.StatusOK, &items)
	if len(items.Data) != 4 || items.Data[0].Content[0].Text != "Once upon a time" {
		t.Fatalf("items %+v", items.Data)
	}

	decodeBody(t, do(t, http.MethodDelete, base, nil), http.StatusOK, &got)
	if !got.Deleted {
		t.Fatalf("delete %+v", got)
	}
	wantFieldError(t, do(t, http.MethodGet, base, nil), http.StatusNotFound, "")
}

// TestResponsesHostileInput: refusals name the field and never start a reply.
func TestResponsesHostileInput(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.MaxPromptTokens = 64 })
	url := s.base + "/v1/responses"
	cases := []struct {
		name   string
		body   any
		status int
		field  string
	}{
		{"malformed JSON", `{"input": "hi"`, http.StatusBadRequest, ""},
		{"trailing data", `{"input": "hi"} {}`, http.StatusBadRequest, ""},
		{"empty body", ``, http.StatusBadRequest, ""},
		{"no input", map[string]any{}, http.StatusBadRequest, "input"},
		{"input number", map[string]any{"input": 5}, http.StatusBadRequest, "input"},
		{"empty input", map[string]any{"input": ""}, http.StatusBadRequest, "input"},
		{"content no parts", map[string]any{"input": []map[string]any{{"role": "user", "content": []any{}}}}, http.StatusBadRequest, "input[0].content"},
		{"content empty string", map[string]any{"input": []map[string]any{{"role": "user", "content": ""}}}, http.StatusBadRequest, "input[0].content"},
		{"content an empty part", map[string]any{"input": []map[string]any{{"role": "developer", "content": []map[string]any{{"type": "input_text", "text": ""}}}, {"role": "user", "content": "hi"}}}, http.StatusBadRequest, "input[0].content"},
		{"max_completion_tokens -1", map[string]any{"input": "hi", "max_completion_tokens": -1}, http.StatusBadRequest, "max_completion_tokens"},
		{"text.format unknown", map[string]any{"input": "hi", "text": map[string]any{"format": map[string]any{"type": "yaml"}}}, http.StatusBadRequest, "text.format.type"},
		{"text.format without schema", map[string]any{"input": "hi", "text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "x"}}}, http.StatusBadRequest, "text.format.schema"},
		{"text.format huge integer range", map[string]any{"input": "hi", "text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "x",
			"schema": map[string]any{"type": "integer", "minimum": -5e15}}}}, http.StatusBadRequest, "text.format.schema"},
		{"ends with assistant", map[string]any{"input": []map[string]any{{"role": "assistant", "content": "x"}}}, http.StatusBadRequest, "input"},
		{"bad role", map[string]any{"input": []map[string]any{{"role": "tool", "content": "x"}}}, http.StatusBadRequest, "input[0].role"},
		{"image part", map[string]any{"input": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "input_image", "image_url": "x"}}}}}, http.StatusBadRequest, "input[0].content[0]"},
		{"text part without text", map[string]any{"input": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "input_text"}}}}}, http.StatusBadRequest, "input[0].content[0].text"},
		{"function output without a call id", map[string]any{"input": []map[string]any{{"type": "function_call_output", "output": "x"}}}, http.StatusBadRequest, "input[0].call_id"},
		{"function output for an unknown call", map[string]any{"input": []map[string]any{{"type": "function_call_output", "call_id": "call_nope", "output": "x"}}}, http.StatusBadRequest, "input[0].call_id"},
		{"unknown item type", map[string]any{"input": []map[string]any{{"type": "web_search_call"}}}, http.StatusBadRequest, "input[0].type"},
		{"max_output_tokens string", map[string]any{"input": "hi", "max_output_tokens": "many"}, http.StatusBadRequest, "max_output_tokens"},
		{"max_output_tokens over cap", map[string]any{"input": "hi", "max_output_tokens": 100000}, http.StatusBadRequest, "max_output_tokens"},
		{"temperature negative", map[string]any{"input": "hi", "temperature": -1}, http.StatusBadRequest, "temperature"},
		{"top_p type", map[string]any{"input": "hi", "top_p": "x"}, http.StatusBadRequest, "top_p"},
		{"store type", map[string]any{"input": "hi", "store": "yes"}, http.StatusBadRequest, "store"},
		{"tools", map[string]any{"input": "hi", "tools": []map[string]any{{"type": "function"}}}, http.StatusBadRequest, "tools[0].name"},
		{"tool type", map[string]any{"input": "hi", "tools": []map[string]any{{"name": "f"}}}, http.StatusBadRequest, "tools[0].type"},
		{"both previous and conversation", map[string]any{"input": "hi", "previous_response_id": "resp_x", "conversation": "conv_x"}, http.StatusBadRequest, "conversation"},
		{"conversation type", map[string]any{"input": "hi", "conversation": 7}, http.StatusBadRequest, "conversation"},
		{"unknown previous", map[string]any{"input": "hi", "previous_response_id": "resp_AAAAAAAAAAAAAAAAAAAAAA000000000000"}, http.StatusNotFound, ""},
		{"malformed previous", map[string]any{"input": "hi", "previous_response_id": "../../etc"}, http.StatusNotFound, ""},
		{"unknown conversation", map[string]any{"input": "hi", "conversation": "conv_AAAAAAAAAAAAAAAAAAAAAA"}, http.StatusNotFound, ""},
		{"too many metadata keys", map[string]any{"input": "hi", "metadata": manyKeys(17)}, http.StatusBadRequest, "metadata"},
		{"prompt over the token cap", map[string]any{"input": strings.Repeat("once upon a time ", 100)}, http.StatusBadRequest, "messages"},
		{"oversized body", `{"input": "` + strings.Repeat("a", 5<<20) + `"}`, http.StatusRequestEntityTooLarge, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantFieldError(t, post(t, url, tc.body), tc.status, tc.field)
		})
	}
	for _, path := range []string{"/v1/responses/nope", "/v1/responses/resp_AAAAAAAAAAAAAAAAAAAAAA000000000000/input_items",
		"/v1/conversations/conv_nope", "/v1/conversations/conv_AAAAAAAAAAAAAAAAAAAAAA/items", "/v1/conversations/conv_AAAAAAAAAAAAAAAAAAAAAA/items/msg_x"} {
		wantFieldError(t, do(t, http.MethodGet, s.base+path, nil), http.StatusNotFound, "")
		wantFieldError(t, do(t, http.MethodDelete, s.base+path, nil), http.StatusNotFound, "")
	}
	conv := s.base + "/v1/conversations"
	wantFieldError(t, post(t, conv, `{"items": "hi"}`), http.StatusBadRequest, "items")
	wantFieldError(t, post(t, conv, `{"items": [{"role": "user"}]}`), http.StatusBadRequest, "items[0].content")
	wantFieldError(t, post(t, conv, `{"items": [{"role": "user", "content": []}]}`), http.StatusBadRequest, "items[0].content")
	wantFieldError(t, post(t, conv, `{"metadata": {"k": 5}}`), http.StatusBadRequest, "metadata")
	wantFieldError(t, post(t, conv, `[1,2]`), http.StatusBadRequest, "")
	var c convObject
	decodeBody(t, post(t, conv, `{}`), http.StatusOK, &c)
	wantFieldError(t, post(t, conv+"/"+c.ID+"/items", `{"items": []}`), http.StatusBadRequest, "items")
	wantFieldError(t, do(t, http.MethodGet, conv+"/"+c.ID+"/items?limit=1000", nil), http.StatusBadRequest, "limit")
	wantFieldError(t, do(t, http.MethodGet, conv+"/"+c.ID+"/items?order=up", nil), http.StatusBadRequest, "order")
	// GET /v1/responses without an upgrade explains itself.
	wantFieldError(t, do(t, http.MethodGet, s.base+"/v1/responses", nil), http.StatusBadRequest, "")
}

func manyKeys(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[strings.Repeat("k", i+1)] = "v"
	}
	return m
}

// TestResponsesWebSocketMode: response.create events on GET /v1/responses
// stream the same events, chain by previous_response_id on the socket, and
// an error event leaves the socket open.
func TestResponsesWebSocketMode(t *testing.T) {
	s := mustOpenAPI(t, nil)
	ws := dial(t, s.url+"/v1/responses", nil)
	send := func(v any) {
		t.Helper()
		if err := ws.WriteJSON(v); err != nil {
			t.Fatal(err)
		}
	}
	read := func() []sseEvent {
		t.Helper()
		var evs []sseEvent
		for {
			var m map[string]any
			if err := ws.ReadJSON(&m); err != nil {
				t.Fatal(err)
			}
			name, _ := m["type"].(string)
			evs = append(evs, sseEvent{name, m})
			switch name {
			case "response.completed", "response.incomplete", "response.failed", "error":
				return evs
			}
		}
	}
	send(map[string]any{"type": "response.create", "input": "Once upon a time", "max_output_tokens": 6})
	_, first := checkEventOrder(t, read())
	send(map[string]any{"type": "response.create", "input": 5})
	if evs := read(); len(evs) != 1 || evs[0].name != "error" {
		t.Fatalf("bad request answered %+v", evs)
	}
	send(map[string]any{"type": "response.create", "input": "Then?", "previous_response_id": first["id"], "max_output_tokens": 6})
	_, second := checkEventOrder(t, read())
	usage := second["usage"].(map[string]any)
	cached := usage["input_tokens_details"].(map[string]any)["cached_tokens"].(float64)
	if second["previous_response_id"] != first["id"] || cached == 0 {
		t.Fatalf("chained over the socket: %+v", second)
	}
	// The same response is visible over HTTP.
	var got respObject
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/responses/"+second["id"].(string), nil), http.StatusOK, &got)

	// Unstored responses chain on the socket that made them, and only there.
	send(map[string]any{"type": "response.create", "input": "Once upon a time", "store": false, "max_output_tokens": 6})
	_, a := checkEventOrder(t, read())
	send(map[string]any{"type": "response.create", "input": "Then?", "store": false, "previous_response_id": a["id"], "max_output_tokens": 6})
	_, b := checkEventOrder(t, read())
	in := func(r map[string]any) float64 { return r["usage"].(map[string]any)["input_tokens"].(float64) }
	if b["store"] != false || b["previous_response_id"] != a["id"] || in(b) <= in(a) {
		t.Fatalf("unstored chain: %+v", b)
	}
	wantFieldError(t, do(t, http.MethodGet, s.base+"/v1/responses/"+b["id"].(string), nil), http.StatusNotFound, "")
	other := dial(t, s.url+"/v1/responses", nil)
	if err := other.WriteJSON(map[string]any{"type": "response.create", "input": "x", "previous_response_id": b["id"]}); err != nil {
		t.Fatal(err)
	}
	var e map[string]any
	if err := other.ReadJSON(&e); err != nil || e["type"] != "error" || e["status"] != float64(http.StatusNotFound) {
		t.Fatalf("another socket chained on an unstored response: %v %v", e, err)
	}
	other.Close()

	// Shutting down closes the socket with 1001, like the chat's.
	if err := s.srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := closeCode(t, ws); code != websocket.CloseGoingAway {
		t.Fatalf("close code %d, want %d", code, websocket.CloseGoingAway)
	}
}

// TestResponsesNeedTheKey: with an API key set, every route of the
// Responses and Conversations APIs and the WebSocket mode require it.
func TestResponsesNeedTheKey(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.APIKey = "k3y" })
	for _, path := range []string{"/v1/responses", "/v1/conversations"} {
		wantFieldError(t, post(t, s.base+path, map[string]any{"input": "hi"}), http.StatusUnauthorized, "")
	}
	for _, path := range []string{"/v1/responses/resp_x", "/v1/responses/resp_x/input_items", "/v1/conversations/conv_x", "/v1/conversations/conv_x/items"} {
		wantFieldError(t, do(t, http.MethodGet, s.base+path, nil), http.StatusUnauthorized, "")
		wantFieldError(t, do(t, http.MethodDelete, s.base+path, nil), http.StatusUnauthorized, "")
	}
	if got := upgradeStatus(t, s.url+"/v1/responses", nil); got != http.StatusUnauthorized {
		t.Fatalf("upgrade without the key: %d", got)
	}
	if got := upgradeStatus(t, s.url+"/v1/responses", http.Header{"Authorization": {"Bearer k3y"}}); got != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade with the key: %d", got)
	}
	var r respObject
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 2}, "Authorization", "Bearer k3y"), http.StatusOK, &r)
}
