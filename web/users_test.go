package web_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/web"
)

// call makes one request as the holder of key ("" sends none) and returns
// its status and body.
func call(tb testing.TB, method, url, key string, body any) (int, string) {
	tb.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		tb.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return res.StatusCode, string(b)
}

func mustCall(tb testing.TB, method, url, key string, body any, v any) {
	tb.Helper()
	code, b := call(tb, method, url, key, body)
	if code != http.StatusOK {
		tb.Fatalf("%s %s: %d %s", method, url, code, b)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(b), v); err != nil {
			tb.Fatalf("%s %s: %v in %s", method, url, err, b)
		}
	}
}

type convList struct {
	Object string `json:"object"`
	Data   []struct {
		ID        string            `json:"id"`
		Session   string            `json:"session"`
		Title     string            `json:"title"`
		Messages  int               `json:"messages"`
		UpdatedAt int64             `json:"updated_at"`
		Metadata  map[string]string `json:"metadata"`
	} `json:"data"`
	HasMore bool `json:"has_more"`
}

func (l convList) titles() []string {
	var t []string
	for _, d := range l.Data {
		t = append(t, d.Title)
	}
	return t
}

// TestCrossUserIDsAreNotFound: with named users, every API answers another
// user's id exactly as it answers an id that names nothing (the same
// status and body, as the owner sees once it is deleted), changes nothing
// of the owner's, and lists only the caller's own conversations.
func TestCrossUserIDsAreNotFound(t *testing.T) {
	const alice, bob, anon = "alice-key-1", "bob-key-2", "anon-key-3"
	s := mustOpenAPI(t, func(c *web.Config) {
		c.APIKey = anon
		c.Users = []web.UserKey{{User: "alice", Key: alice}, {User: "bob", Key: bob}}
	})
	auth := func(key string) http.Header { return http.Header{"Authorization": {"Bearer " + key}} }

	// Alice: a chat on the WebSocket, a response, a conversation.
	ws := dial(t, s.url+"/ws?format=json", auth(alice))
	sid := readJSON(t, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 4}})
	readUntilDone(t, ws)
	ws.Close()
	var r respObject
	mustCall(t, "POST", s.base+"/v1/responses", alice, map[string]any{"input": "A story", "max_output_tokens": 4}, &r)
	var conv convObject
	mustCall(t, "POST", s.base+"/v1/conversations", alice, map[string]any{
		"items": []map[string]any{{"type": "message", "role": "user", "content": "Tell me about cats."}}}, &conv)
	var items itemsList
	mustCall(t, "GET", s.base+"/v1/conversations/"+conv.ID+"/items", alice, nil, &items)
	item := items.Data[0].ID

	type req struct {
		method, path string
		body         any
	}
	reqs := []req{
		{"GET", "/v1/responses/" + r.ID, nil},
		{"GET", "/v1/responses/" + r.ID + "/input_items", nil},
		{"POST", "/v1/responses/" + r.ID + "/cancel", nil},
		{"DELETE", "/v1/responses/" + r.ID, nil},
		{"POST", "/v1/responses", map[string]any{"input": "go on", "previous_response_id": r.ID, "max_output_tokens": 2}},
		{"POST", "/v1/responses", map[string]any{"input": "go on", "conversation": conv.ID, "max_output_tokens": 2}},
		{"GET", "/v1/conversations/" + conv.ID, nil},
		{"POST", "/v1/conversations/" + conv.ID, map[string]any{"metadata": map[string]string{"a": "b"}}},
		{"POST", "/v1/conversations/" + conv.ID, map[string]any{"title": "mine"}},
		{"GET", "/v1/conversations/" + conv.ID + "/items", nil},
		{"POST", "/v1/conversations/" + conv.ID + "/items", map[string]any{"items": []map[string]any{{"role": "user", "content": "x"}}}},
		{"GET", "/v1/conversations/" + conv.ID + "/items/" + item, nil},
		{"DELETE", "/v1/conversations/" + conv.ID + "/items/" + item, nil},
		{"POST", "/v1/conversations/" + conv.ID + "/fork", map[string]any{"messages": 0}},
		{"DELETE", "/v1/conversations/" + conv.ID, nil},
		{"GET", "/v1/conversations/conv_" + sid + "/items", nil},
		{"DELETE", "/v1/conversations/conv_" + sid, nil},
	}
	type answer struct {
		code int
		body string
	}
	others := map[string][]answer{}
	for _, key := range []string{bob, anon} {
		for _, q := range reqs {
			code, body := call(t, q.method, s.base+q.path, key, q.body)
			if code != http.StatusNotFound {
				t.Errorf("%s %s as another user: %d %s, want 404", q.method, q.path, code, body)
			}
			others[key] = append(others[key], answer{code, body})
		}
		// The chat WebSocket does not resume it.
		ws := dial(t, s.url+"/ws?format=json&session="+sid, auth(key))
		if m := readJSON(t, ws); m.Type != "error" || m.Code != "not_found" {
			t.Errorf("another user resumed alice's chat: %+v", m)
		}
		ws.Close()
		// Nor does the Responses WebSocket mode chain from her response.
		rws := dial(t, s.url+"/v1/responses", auth(key))
		rws.WriteJSON(map[string]any{"type": "response.create", "input": "go on", "previous_response_id": r.ID, "max_output_tokens": 2})
		var ev map[string]any
		if err := rws.ReadJSON(&ev); err != nil || ev["type"] != "error" || ev["status"] != float64(http.StatusNotFound) {
			t.Errorf("another user chained from alice's response on the Responses WebSocket: %v %v", ev, err)
		}
		rws.Close()
		var l convList
		mustCall(t, "GET", s.base+"/v1/conversations", key, nil, &l)
		if len(l.Data) != 0 {
			t.Errorf("another user lists %v", l.titles())
		}
	}

	// Nothing of Alice's changed, and she lists her three.
	var l convList
	mustCall(t, "GET", s.base+"/v1/conversations", alice, nil, &l)
	if got := strings.Join(l.titles(), "|"); got != "Tell me about cats.|A story|Once upon a time" {
		t.Fatalf("alice lists %q", got)
	}
	mustCall(t, "GET", s.base+"/v1/responses/"+r.ID, alice, nil, nil)
	mustCall(t, "GET", s.base+"/v1/conversations/"+conv.ID+"/items", alice, nil, &items)
	if len(items.Data) != 1 {
		t.Fatalf("alice's conversation changed: %+v", items.Data)
	}

	// Once Alice deletes them, she gets what the others got: another
	// user's id is answered exactly as an unknown one.
	for _, c := range l.Data {
		mustCall(t, "DELETE", s.base+"/v1/conversations/"+c.ID, alice, nil, nil)
	}
	for i, q := range reqs {
		code, body := call(t, q.method, s.base+q.path, alice, q.body)
		for _, key := range []string{bob, anon} {
			if o := others[key][i]; o.code != code || o.body != body {
				t.Errorf("%s %s: another user got %d %s, an unknown id %d %s", q.method, q.path, o.code, o.body, code, body)
			}
		}
	}
	mustCall(t, "GET", s.base+"/v1/conversations", alice, nil, &l)
	if len(l.Data) != 0 {
		t.Fatalf("deleted conversations still listed: %v", l.titles())
	}
	// A wrong key is still refused.
	if code, _ := call(t, "GET", s.base+"/v1/conversations", "nobody", nil); code != http.StatusUnauthorized {
		t.Fatalf("a wrong key: %d", code)
	}
	// The log names users, never their keys.
	named := false
	for _, e := range s.logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		for _, key := range []string{alice, bob, anon} {
			if strings.Contains(line, key) {
				t.Errorf("a key in the log: %s", line)
			}
		}
		if e.ContextMap()["user"] == "alice" {
			named = true
		}
	}
	if !named {
		t.Error("no log line names the user alice")
	}
}

// TestConversationListRenameForkRegenerate: the list is paged newest first,
// searchable by title, renamed by POST {"title"}; a fork keeps the
// original; a regenerate over the WebSocket replaces the last reply in the
// stored session. No keys: one anonymous user.
func TestConversationListRenameForkRegenerate(t *testing.T) {
	s := mustOpenAPI(t, nil)
	for _, p := range []string{"First story", "Second story", "Third tale"} {
		mustCall(t, "POST", s.base+"/v1/conversations", "", map[string]any{
			"items": []map[string]any{{"role": "user", "content": p}}}, nil)
	}
	var l convList
	mustCall(t, "GET", s.base+"/v1/conversations?limit=2", "", nil, &l)
	if got := strings.Join(l.titles(), "|"); got != "Third tale|Second story" || !l.HasMore {
		t.Fatalf("first page %q more %v", got, l.HasMore)
	}
	mustCall(t, "GET", s.base+"/v1/conversations?limit=2&after="+l.Data[1].ID, "", nil, &l)
	if got := strings.Join(l.titles(), "|"); got != "First story" || l.HasMore {
		t.Fatalf("second page %q more %v", got, l.HasMore)
	}
	first := l.Data[0]
	mustCall(t, "POST", s.base+"/v1/conversations/"+first.ID, "", map[string]any{"title": "Renamed tale"}, nil)
	mustCall(t, "GET", s.base+"/v1/conversations?q=TALE", "", nil, &l)
	if got := strings.Join(l.titles(), "|"); got != "Renamed tale|Third tale" {
		t.Fatalf("search %q", got)
	}
	wantFieldError(t, do(t, http.MethodGet, s.base+"/v1/conversations?limit=0", nil), http.StatusBadRequest, "limit")

	// A chat on the WebSocket is listed by its first prompt, regenerated in place.
	ws := dial(t, s.url+"/ws?format=json", nil)
	sid := readJSON(t, ws).SessionID()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 4}})
	_, done := readUntilDone(t, ws)
	ws.WriteJSON(map[string]any{"type": "regenerate", "params": map[string]any{"max_tokens": 6, "temperature": 1, "seed": 7}})
	_, again := readUntilDone(t, ws)
	if again.Type != "done" {
		t.Fatalf("regenerate: %+v", again)
	}
	var items itemsList
	mustCall(t, "GET", s.base+"/v1/conversations/conv_"+sid+"/items?order=asc", "", nil, &items)
	if len(items.Data) != 2 || items.Data[0].Content[0].Text != "Once upon a time" || items.Data[1].Content[0].Text != again.Content {
		t.Fatalf("after regenerate (first reply %q, second %q): %+v", done.Content, again.Content, items.Data)
	}

	// Edit and resend: a fork of the first 0 messages, then a prompt on it.
	var fork convObject
	mustCall(t, "POST", s.base+"/v1/conversations/conv_"+sid+"/fork", "", map[string]any{"messages": 0}, &fork)
	ws2 := dial(t, s.url+"/ws?format=json&session="+strings.TrimPrefix(fork.ID, "conv_"), nil)
	if m := readJSON(t, ws2); m.Type != "session" || !m.Resumed || len(m.Messages) != 0 {
		t.Fatalf("the fork: %+v", m)
	}
	ws2.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a night", "params": map[string]any{"max_tokens": 4}})
	readUntilDone(t, ws2)
	mustCall(t, "GET", s.base+"/v1/conversations?q=once", "", nil, &l)
	if got := strings.Join(l.titles(), "|"); got != "Once upon a night|Once upon a time" {
		t.Fatalf("after the fork %q", got)
	}
	mustCall(t, "GET", s.base+"/v1/conversations/conv_"+sid+"/items?order=asc", "", nil, &items)
	if len(items.Data) != 2 || items.Data[0].Content[0].Text != "Once upon a time" {
		t.Fatalf("the original after the fork: %+v", items.Data)
	}
	wantFieldError(t, post(t, s.base+"/v1/conversations/conv_"+sid+"/fork", map[string]any{"messages": 3}), http.StatusBadRequest, "messages")
}

// TestRenameMetadataLimit: the title is kept in metadata, so renaming a conversation whose metadata already holds
// the 16 keys OpenAI allows is a 400 naming "title" and changes nothing, whether the keys were stored before or come
// in the same request; a conversation that has a title is renamed in place.
func TestRenameMetadataLimit(t *testing.T) {
	s := mustOpenAPI(t, nil)
	full := map[string]any{}
	for i := range 16 {
		full[fmt.Sprintf("k%d", i)] = "v"
	}
	var conv struct {
		ID       string            `json:"id"`
		Metadata map[string]string `json:"metadata"`
	}
	mustCall(t, "POST", s.base+"/v1/conversations", "", map[string]any{"metadata": full}, &conv)
	url := s.base + "/v1/conversations/" + conv.ID
	wantFieldError(t, do(t, http.MethodPost, url, map[string]any{"title": "One more"}), http.StatusBadRequest, "title")
	mustCall(t, "POST", url, "", map[string]any{"metadata": map[string]any{"a": "1"}}, nil)
	wantFieldError(t, do(t, http.MethodPost, url, map[string]any{"title": "One more", "metadata": full}), http.StatusBadRequest, "title")
	conv.Metadata = nil // Unmarshal would add to the map
	mustCall(t, "GET", url, "", nil, &conv)
	if len(conv.Metadata) != 1 || conv.Metadata["a"] != "1" {
		t.Fatalf("metadata after the refused updates: %v", conv.Metadata)
	}

	titled := map[string]any{"title": "Old"}
	for i := range 15 {
		titled[fmt.Sprintf("k%d", i)] = "v"
	}
	mustCall(t, "POST", url, "", map[string]any{"metadata": titled}, nil)
	conv.Metadata = nil
	mustCall(t, "POST", url, "", map[string]any{"title": "New"}, &conv)
	if len(conv.Metadata) != 16 || conv.Metadata["title"] != "New" {
		t.Fatalf("renamed in place: %v", conv.Metadata)
	}
}
