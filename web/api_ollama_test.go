package web_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/parley-chat/parley/web"
)

// ollamaFinal is the last object of an Ollama reply (or the only one).
type ollamaFinal struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
	Message   *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"message"`
	Response           *string `json:"response"`
	Done               bool    `json:"done"`
	DoneReason         string  `json:"done_reason"`
	Context            []int   `json:"context"`
	TotalDuration      int64   `json:"total_duration"`
	LoadDuration       int64   `json:"load_duration"`
	PromptEvalCount    int     `json:"prompt_eval_count"`
	PromptEvalDuration int64   `json:"prompt_eval_duration"`
	EvalCount          int     `json:"eval_count"`
	EvalDuration       int64   `json:"eval_duration"`
	PromptCachedCount  int     `json:"prompt_cached_count"`
	Error              string  `json:"error"`
}

func (f ollamaFinal) text() string {
	if f.Message != nil {
		return f.Message.Content
	}
	if f.Response != nil {
		return *f.Response
	}
	return ""
}

// ollamaWhole posts a stream: false request and returns its one object.
func ollamaWhole(tb testing.TB, s *stack, path string, body map[string]any) ollamaFinal {
	tb.Helper()
	body["stream"] = false
	var f ollamaFinal
	decodeBody(tb, post(tb, s.base+path, body), http.StatusOK, &f)
	checkFinal(tb, f)
	return f
}

// ollamaStream posts a streamed request and returns its objects, checking
// the NDJSON framing: one object per line, done only on the last.
func ollamaStream(tb testing.TB, s *stack, path string, body map[string]any) ([]ollamaFinal, ollamaFinal) {
	tb.Helper()
	res := post(tb, s.base+path, body)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/x-ndjson" {
		b, _ := io.ReadAll(res.Body)
		tb.Fatalf("status %d, type %q: %s", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	var objs []ollamaFinal
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var f ollamaFinal
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			tb.Fatalf("line %q: %v", sc.Text(), err)
		}
		objs = append(objs, f)
	}
	if len(objs) == 0 {
		tb.Fatal("empty stream")
	}
	for _, o := range objs[:len(objs)-1] {
		if o.Done || o.Error != "" || o.text() == "" {
			tb.Fatalf("object before the last: %+v", o)
		}
	}
	last := objs[len(objs)-1]
	checkFinal(tb, last)
	return objs[:len(objs)-1], last
}

// checkFinal checks the last object's counts and timings.
func checkFinal(tb testing.TB, f ollamaFinal) {
	tb.Helper()
	if !f.Done || f.Error != "" || f.Model != "llama:latest" || f.CreatedAt == "" {
		tb.Fatalf("last object %+v", f)
	}
	if f.DoneReason != "stop" && f.DoneReason != "length" {
		tb.Fatalf("done_reason %q", f.DoneReason)
	}
	if f.PromptEvalCount < 1 || f.EvalCount < 1 || f.PromptCachedCount >= f.PromptEvalCount {
		tb.Fatalf("counts %+v", f)
	}
	if f.TotalDuration <= 0 || f.PromptEvalDuration <= 0 || f.EvalDuration < 0 || f.LoadDuration <= 0 ||
		f.TotalDuration < f.PromptEvalDuration+f.EvalDuration {
		tb.Fatalf("durations %+v", f)
	}
}

func ollamaChat(text string, n int) map[string]any {
	return map[string]any{"model": "llama:latest", "messages": userMsgs(text), "options": map[string]any{"num_predict": n}}
}

func TestOllamaProbes(t *testing.T) {
	s := mustOpenAPI(t, nil)
	get := func(path string, v any) {
		t.Helper()
		res, err := http.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		decodeBody(t, res, http.StatusOK, v)
	}
	var ver struct{ Version string }
	get("/api/version", &ver)
	if ver.Version == "" {
		t.Fatal("no version")
	}
	var tags struct {
		Models []struct {
			Name, Model, Digest string
			Size                int64
			Details             struct{ Format, Family, QuantizationLevel string }
		}
	}
	get("/api/tags", &tags)
	if len(tags.Models) != 1 || tags.Models[0].Name != "llama:latest" || tags.Models[0].Size <= 0 ||
		len(tags.Models[0].Digest) != 64 || tags.Models[0].Details.Format != "gguf" || tags.Models[0].Details.Family != "llama" {
		t.Fatalf("tags %+v", tags)
	}
	var ps struct {
		Models []struct {
			Name          string
			ExpiresAt     string `json:"expires_at"`
			ContextLength int    `json:"context_length"`
		}
	}
	get("/api/ps", &ps)
	if len(ps.Models) != 1 || ps.Models[0].Name != "llama:latest" || ps.Models[0].ContextLength != 512 || ps.Models[0].ExpiresAt == "" {
		t.Fatalf("ps %+v", ps)
	}
	// VS Code's provider: /api/show per model, reading capabilities and the context length.
	for _, name := range []string{"llama:latest", "llama", "LLAMA:latest"} {
		var show struct {
			Capabilities []string
			ModelInfo    map[string]any `json:"model_info"`
			Parameters   string
			Details      struct{ Family string }
		}
		decodeBody(t, post(t, s.base+"/api/show", map[string]any{"model": name}), http.StatusOK, &show)
		if fmt.Sprint(show.Capabilities) != "[completion]" || show.ModelInfo["general.architecture"] != "llama" ||
			show.ModelInfo["llama.context_length"] == nil || !strings.Contains(show.Parameters, "num_ctx") {
			t.Fatalf("show %s: %+v", name, show)
		}
	}
	var e struct{ Error string }
	decodeBody(t, post(t, s.base+"/api/show", map[string]any{"model": "mistral:7b"}), http.StatusNotFound, &e)
	if !strings.Contains(e.Error, `"mistral:7b" not found`) {
		t.Fatalf("404 error %q", e.Error)
	}
	// HEAD / answers like Ollama; GET / is still the chat page.
	res, err := http.Head(s.base + "/")
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("HEAD /: %v %v", res, err)
	}
	res, err = http.Get(s.base + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
}

// TestOllamaChatStreamEqualsWhole: a greedy reply streamed is the same
// text as the reply whole, on both endpoints.
func TestOllamaChatStreamEqualsWhole(t *testing.T) {
	s := mustOpenAPI(t, nil)
	for _, path := range []string{"/api/chat", "/api/generate"} {
		body := func() map[string]any {
			if path == "/api/chat" {
				return ollamaChat("Tell me about a cat.", 16)
			}
			return map[string]any{"model": "llama", "prompt": "Once upon a time", "system": "You tell stories.", "options": map[string]any{"num_predict": 16}}
		}
		whole := ollamaWhole(t, s, path, body())
		pieces, last := ollamaStream(t, s, path, body())
		var b strings.Builder
		for _, p := range pieces {
			b.WriteString(p.text())
		}
		if whole.text() == "" || b.String() != whole.text() || last.text() != "" {
			t.Fatalf("%s: streamed %q, whole %q, last %q", path, b.String(), whole.text(), last.text())
		}
		if whole.EvalCount != 16 || whole.DoneReason != "length" || last.EvalCount != 16 {
			t.Fatalf("%s: eval_count %d/%d done_reason %q", path, whole.EvalCount, last.EvalCount, whole.DoneReason)
		}
		if path == "/api/generate" && (len(whole.Context) <= whole.PromptEvalCount || len(last.Context) != len(whole.Context)) {
			t.Fatalf("context of %d ids for %d prompt tokens", len(whole.Context), whole.PromptEvalCount)
		}
	}
}

// TestOllamaGenerateContext: the context array one reply returns continues
// the next, raw or templated; ids that are not the model's are refused.
func TestOllamaGenerateContext(t *testing.T) {
	s := mustOpenAPI(t, nil)
	first := ollamaWhole(t, s, "/api/generate", map[string]any{"model": "llama", "prompt": "Once upon a time", "raw": true, "options": map[string]any{"num_predict": 8}})
	for _, raw := range []bool{true, false} {
		next := ollamaWhole(t, s, "/api/generate", map[string]any{"model": "llama", "prompt": " Then", "raw": raw, "context": first.Context, "options": map[string]any{"num_predict": 8}})
		if next.PromptEvalCount < len(first.Context) || len(next.Context) <= len(first.Context) {
			t.Fatalf("raw %v: %d prompt tokens after a context of %d", raw, next.PromptEvalCount, len(first.Context))
		}
	}
	// With a context the templated prompt is tokenized as it is: control-token text is refused.
	res := post(t, s.base+"/api/generate", map[string]any{"model": "llama", "prompt": "hi </s> there", "context": first.Context})
	wantOllamaError(t, res, http.StatusBadRequest, "prompt")
	bad := append(append([]int(nil), first.Context...), 1<<20)
	res = post(t, s.base+"/api/generate", map[string]any{"model": "llama", "prompt": "x", "context": bad})
	wantOllamaError(t, res, http.StatusBadRequest, fmt.Sprintf("context[%d]", len(bad)-1))
}

func wantOllamaError(tb testing.TB, res *http.Response, status int, names string) {
	tb.Helper()
	var e map[string]any
	decodeBody(tb, res, status, &e)
	msg, ok := e["error"].(string)
	if !ok || len(e) != 1 || !strings.Contains(msg, names) {
		tb.Fatalf("error %v: want Ollama's {\"error\": \"...\"} naming %q", e, names)
	}
}

// TestOllamaHostile: every malformed body is a 400 whose message names
// what is wrong, and unsupported features are refused, never ignored.
func TestOllamaHostile(t *testing.T) {
	s := mustOpenAPI(t, nil)
	user := []map[string]any{{"role": "user", "content": "hi"}}
	chat := func(kv ...any) map[string]any {
		b := map[string]any{"model": "llama", "messages": user}
		for i := 0; i+1 < len(kv); i += 2 {
			b[kv[i].(string)] = kv[i+1]
		}
		return b
	}
	opt := func(k string, v any) map[string]any { return chat("options", map[string]any{k: v}) }
	huge := map[string]any{}
	for i := range 20000 {
		huge[fmt.Sprintf("opt%05d", i)] = i
	}
	cases := []struct {
		name   string
		body   any
		status int
		names  string
	}{
		{"messages a string", `{"model":"llama","messages":"hi"}`, 400, "messages: expected an array"},
		{"content a number", `{"model":"llama","messages":[{"role":"user","content":5}]}`, 400, "messages.content"},
		{"body an array", `[1,2]`, 400, "expected an object"},
		{"stream a string", `{"model":"llama","messages":[],"stream":"yes"}`, 400, "stream: expected bool"},
		{"model a number", `{"model":5,"messages":[]}`, 400, "model: expected string"},
		{"a null message", `{"model":"llama","messages":[null]}`, 400, "messages[0].role"},
		{"no model", map[string]any{"messages": user}, 400, "model"},
		{"unknown model", chat("model", "qwen3:8b"), 404, "qwen3:8b"},
		{"bad role", chat("messages", []map[string]any{{"role": "robot", "content": "x"}}), 400, "messages[0].role"},
		{"temperature a string", opt("temperature", "hot"), 400, "options.temperature"},
		{"temperature too high", opt("temperature", 99), 400, "options.temperature"},
		{"repeat_penalty negative", opt("repeat_penalty", -1), 400, "options.repeat_penalty"},
		{"num_predict zero", opt("num_predict", 0), 400, "options.num_predict"},
		{"num_predict huge", opt("num_predict", 1e12), 400, "options.num_predict"},
		{"top_k fractional", opt("top_k", 1.5), 400, "options.top_k"},
		{"seed out of range", opt("seed", -7), 400, "options.seed"},
		{"stop a number", opt("stop", 5), 400, "options.stop"},
		{"num_ctx over the server's", opt("num_ctx", 1<<20), 400, "options.num_ctx"},
		{"mirostat", opt("mirostat", 2), 400, "options.mirostat"},
		{"unknown option", opt("temprature", 0.5), 400, "options.temprature"},
		{"huge options", chat("options", huge), 400, "options.opt00000"},
		{"options an array", chat("options", []int{1}), 400, "options"},
		{"format xml", chat("format", "xml"), 400, "format"},
		{"format a bad schema", chat("format", map[string]any{"type": "nope"}), 400, "format"},
		{"keep_alive nonsense", chat("keep_alive", "forever"), 400, "keep_alive"},
		{"keep_alive an object", chat("keep_alive", map[string]any{}), 400, "keep_alive"},
		{"tools without a function", chat("tools", []map[string]any{{"type": "function"}}), 400, "tools[0].function"},
		{"think on a model without a thought", chat("think", true), 400, "think"},
		{"tools a string", chat("tools", "all"), 400, "tools"},
		{"a tool result answering nothing", chat("messages", []map[string]any{{"role": "tool", "content": "21C"}}), 400, "messages[0]"},
		{"tool call arguments an array", chat("messages", []map[string]any{{"role": "user", "content": "x"},
			{"role": "assistant", "content": "", "tool_calls": []map[string]any{{"function": map[string]any{"name": "f", "arguments": []int{1}}}}}}),
			400, "messages[1].tool_calls[0].function.arguments"},
		{"tool calls from the user", chat("messages", []map[string]any{{"role": "user", "content": "x",
			"tool_calls": []map[string]any{{"function": map[string]any{"name": "f"}}}}}), 400, "messages[0].tool_calls"},
		{"images", chat("messages", []map[string]any{{"role": "user", "content": "x", "images": []string{"aGk="}}}), 400, "images"},
		{"generate template", map[string]any{"model": "llama", "prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"},
		{"generate suffix", map[string]any{"model": "llama", "prompt": "x", "suffix": "y"}, 400, "suffix"},
		{"generate context strings", map[string]any{"model": "llama", "prompt": "x", "context": []string{"a"}}, 400, "context"},
		{"generate negative id", map[string]any{"model": "llama", "prompt": "x", "context": []int{1, -5}}, 400, "context[1]"},
		{"generate context too long", map[string]any{"model": "llama", "prompt": "x", "context": make([]int, 600)}, 400, "context"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := "/api/chat"
			if b, ok := c.body.(map[string]any); ok && b["prompt"] != nil {
				path = "/api/generate"
			}
			wantOllamaError(t, post(t, s.base+path, c.body), c.status, c.names)
		})
	}
	for _, u := range []struct{ method, path, says string }{
		{http.MethodPost, "/api/pull", "--model"},
		{http.MethodPost, "/api/push", "not"},
		{http.MethodPost, "/api/create", "--model"},
		{http.MethodPost, "/api/copy", "not"},
		{http.MethodDelete, "/api/delete", "not"},
		{http.MethodPost, "/api/embed", "embeddings"},
		{http.MethodPost, "/api/embeddings", "embeddings"},
	} {
		req, _ := http.NewRequest(u.method, s.base+u.path, strings.NewReader(`{"model":"llama"}`))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		wantOllamaError(t, res, http.StatusNotImplemented, u.says)
		res.Body.Close()
	}
	s.waitIdle(t)
}

// TestOllamaFormatSchema: format as a JSON schema constrains the reply.
func TestOllamaFormatSchema(t *testing.T) {
	s := mustOpenAPI(t, nil)
	schema := map[string]any{"type": "object", "properties": map[string]any{"age": map[string]any{"type": "integer"}},
		"required": []string{"age"}, "additionalProperties": false}
	for _, format := range []any{schema, "json"} {
		body := ollamaChat("How old is the cat?", 64)
		body["format"] = format
		f := ollamaWhole(t, s, "/api/chat", body)
		var v map[string]any
		if err := json.Unmarshal([]byte(f.text()), &v); err != nil && f.DoneReason == "stop" {
			t.Fatalf("format %v: reply %q is not JSON: %v", format, f.text(), err)
		}
		if _, ok := v["age"]; format != "json" && f.DoneReason == "stop" && !ok {
			t.Fatalf("reply %q lacks age", f.text())
		}
	}
}

// TestOllamaLoadAndKeepAlive: a request with nothing to generate loads
// (keep_alive 0: unloads) as Ollama answers it; keep_alive is accepted in
// its forms.
func TestOllamaLoadAndKeepAlive(t *testing.T) {
	s := mustOpenAPI(t, nil)
	for _, c := range []struct {
		path   string
		body   map[string]any
		reason string
	}{
		{"/api/generate", map[string]any{"model": "llama"}, "load"},
		{"/api/chat", map[string]any{"model": "llama", "messages": []any{}}, "load"},
		{"/api/generate", map[string]any{"model": "llama", "keep_alive": 0}, "unload"},
		{"/api/chat", map[string]any{"model": "llama", "keep_alive": "0s"}, "unload"},
	} {
		var f ollamaFinal
		decodeBody(t, post(t, s.base+c.path, c.body), http.StatusOK, &f)
		if !f.Done || f.DoneReason != c.reason {
			t.Fatalf("%s %v: %+v", c.path, c.body, f)
		}
	}
	for _, ka := range []any{"5m", "-1", -1, 300, "1h30m"} {
		body := ollamaChat("Hi.", 2)
		body["keep_alive"] = ka
		ollamaWhole(t, s, "/api/chat", body)
	}
}

// resendConversation plays a conversation of turns user messages, resending
// the whole of it each turn as a stateless client does, and returns each
// turn's last object.
func resendConversation(tb testing.TB, base, opening string, turns int) []ollamaFinal {
	msgs := []map[string]any{{"role": "system", "content": "You tell stories."}}
	var out []ollamaFinal
	for i := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("%s %d.", opening, i+1)})
		var f ollamaFinal
		decodeBody(tb, post(tb, base+"/api/chat", map[string]any{"model": "llama", "messages": msgs, "stream": false,
			"options": map[string]any{"num_predict": 10}}), http.StatusOK, &f)
		out = append(out, f)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": f.text()})
	}
	return out
}

// checkWarm checks that each turn after the first evaluated at most its new
// tokens + 4: what the previous turn's prompt and reply held was cached.
func checkWarm(tb testing.TB, turns []ollamaFinal, strict bool) (evaluated, total int) {
	tb.Helper()
	for i := 1; i < len(turns); i++ {
		prev, cur := turns[i-1], turns[i]
		seen := prev.PromptEvalCount + prev.EvalCount
		if strict && cur.PromptCachedCount < seen-4 {
			tb.Errorf("turn %d: %d of %d prompt tokens cached; the previous turn's prompt and reply were %d", i+1, cur.PromptCachedCount, cur.PromptEvalCount, seen)
		}
		evaluated += cur.PromptEvalCount - cur.PromptCachedCount
		total += cur.PromptEvalCount
	}
	return evaluated, total
}

// TestOllamaWarmResends: a 10-turn conversation resent whole each turn is
// served from the KV cache: each turn evaluates its new tokens (+4 at
// most). With 8 such clients at once on --parallel 4, 4 cache slots hold
// only 4 conversations' caches, so most turns land on a slot another
// conversation used last: that case is measured (and logged), and checked
// only for what the slots can give, the shared system prompt. With 8 cache
// slots (--cache-slots 8) every turn is warm.
func TestOllamaWarmResends(t *testing.T) {
	t.Run("one client", func(t *testing.T) {
		s := mustOpenAPI(t, nil)
		ev, total := checkWarm(t, resendConversation(t, s.base, "Dog", 10), true)
		t.Logf("turns 2-10 evaluated %d of %d prompt tokens", ev, total)
	})
	// With as many cache slots as clients, each conversation keeps its
	// cache between turns even though only 4 generate at once.
	for _, c := range []struct {
		slots int
		ram   int64
	}{{4, 0}, {8, 0}, {4, 64 << 20}} {
		t.Run(fmt.Sprintf("8 clients, parallel 4, %d cache slots, kv-cache-ram %d", c.slots, c.ram), func(t *testing.T) {
			ev, total := eightClients(t, c.slots, c.ram, c.slots == 8 || c.ram > 0)
			t.Logf("8 clients, parallel 4, %d cache slots, kv-cache-ram %d, turns 2-10: evaluated %d of %d prompt tokens", c.slots, c.ram, ev, total)
		})
	}
}

// eightClients runs 8 resending clients at once on 4 parallel slots and
// slots cache slots; strict checks each turn's warmth.
func eightClients(t *testing.T, slots int, ram int64, strict bool) (evaluated, total int) {
	s := openStack(t, stackOpts{parallel: 4, cacheSlots: slots, kvCacheRAM: ram, maxTokens: 24, maxTokensCap: 480, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	var wg sync.WaitGroup
	results := make([][]ollamaFinal, 8)
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[c] = resendConversation(t, s.base, fmt.Sprintf("Cat %c", 'A'+c), 10)
		}()
	}
	wg.Wait()
	for _, r := range results {
		if len(r) != 10 {
			t.Fatalf("a client finished %d turns", len(r))
		}
		for i, f := range r[1:] {
			if f.PromptCachedCount < 8 {
				t.Errorf("turn %d: %d prompt tokens cached; the system prompt is shared by every slot", i+2, f.PromptCachedCount)
			}
		}
		e, tt := checkWarm(t, r, strict)
		evaluated, total = evaluated+e, total+tt
	}
	return evaluated, total
}
