package main

// End-to-end tests of several models in one server (--models,
// --models-file): the real binary, stories260K beside synthetic models of
// other shapes (internal/synth), over real sockets.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// synthModel writes a small synthetic model (stories260K's vocabulary) of
// the given shape to dir/name.gguf.
func synthModel(t *testing.T, dir, name string, layers, dim int) string {
	t.Helper()
	spec := synth.DefaultSpec()
	spec.Name, spec.VocabFrom = name, testmodel.Path(t)
	spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN, spec.Context = layers, dim, 4, 2, 2*dim, 2048
	out := filepath.Join(dir, name+".gguf")
	if _, err := synth.Write(context.Background(), out, spec); err != nil {
		t.Fatalf("synthetic model %s: %v", name, err)
	}
	return out
}

// modelsDir is a folder of three models: stories (stories260K), wide and
// deep (synthetic, of two other shapes).
func modelsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(testmodel.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stories.gguf"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	synthModel(t, dir, "wide", 2, 256)
	synthModel(t, dir, "deep", 6, 64)
	return dir
}

// call posts body (JSON) to path with the API key when one is given and
// returns the status and the body.
func call(t *testing.T, s *server, method, path, key string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+s.addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

type listedModel struct {
	ID        string         `json:"id"`
	State     string         `json:"state"`
	SizeBytes int64          `json:"size_bytes"`
	Pinned    bool           `json:"pinned"`
	InFlight  int            `json:"replies_in_flight"`
	LastError string         `json:"last_error"`
	Settings  map[string]any `json:"settings"`
	Engine    string         `json:"engine"`
}

func listModels(t *testing.T, s *server, key string) map[string]listedModel {
	t.Helper()
	code, b := call(t, s, "GET", "/v1/models", key, nil)
	if code != 200 {
		t.Fatalf("/v1/models: %d %s", code, b)
	}
	var l struct{ Data []listedModel }
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]listedModel{}
	for _, m := range l.Data {
		out[m.ID] = m
	}
	return out
}

// chatWith asks model for a greedy reply of n tokens and returns its text.
func chatWith(t *testing.T, s *server, key, model, prompt string, n int) string {
	t.Helper()
	code, b := call(t, s, "POST", "/v1/chat/completions", key, map[string]any{
		"model": model, "messages": []map[string]string{{"role": "user", "content": prompt}}, "max_tokens": n, "temperature": 0})
	if code != 200 {
		t.Fatalf("chat with %s: %d %s", model, code, b)
	}
	var r struct {
		Model   string
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("chat with %s: %s (%v)", model, b, err)
	}
	if r.Model != model {
		t.Fatalf("asked %s, the reply names %s", model, r.Model)
	}
	return r.Choices[0].Message.Content
}

// loads counts the server's "model loaded" log lines for model.
func loads(s *server, model string) int {
	n := 0
	for _, line := range strings.Split(s.log(), "\n") {
		if strings.Contains(line, `"msg":"model loaded"`) && strings.Contains(line, `"model":"`+model+`"`) && strings.Contains(line, `"load_time"`) && strings.Contains(line, `"logger":"models"`) {
			n++
		}
	}
	return n
}

func waitState(t *testing.T, s *server, key, model, state string) {
	t.Helper()
	for end := time.Now().Add(hangWait); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if listModels(t, s, key)[model].State == state {
			return
		}
	}
	t.Fatalf("%s never became %s: %+v", model, state, listModels(t, s, key)[model])
}

func TestSeveralModels(t *testing.T) {
	bin := testbin.Parley(t)
	const key = "models-key"
	// --min-residency 0: the order of unloads below is least recently used
	// alone (a residency ends with time: TestMinResidencyDampsThrash).
	s := launch(t, bin, "--models", modelsDir(t), "--max-loaded-models", "2", "--keep-alive", "-1s", "--min-residency", "0",
		"--api-key", key, "--user", "carol:carol-key", "--store", "memory")

	ms := listModels(t, s, key)
	if len(ms) != 3 {
		t.Fatalf("/v1/models lists %d models: %+v", len(ms), ms)
	}
	for name, m := range ms {
		if m.State != "unloaded" || m.SizeBytes <= 0 || m.Settings["ctx"] != float64(512) {
			t.Errorf("%s before any request: %+v", name, m)
		}
	}
	// Where a model lives is shown to the server's key only: a user's key
	// sees the file's name.
	for name, m := range listModels(t, s, "carol-key") {
		full, _ := ms[name].Settings["path"].(string)
		if !filepath.IsAbs(full) || m.Settings["path"] != filepath.Base(full) {
			t.Errorf("%s's path: %v to the server's key, %v to a user's", name, full, m.Settings["path"])
		}
	}

	// Anthropic's clients (anthropic-version) get every model in Anthropic's shape.
	req, _ := http.NewRequest("GET", "http://"+s.addr+"/v1/models", nil)
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", "2023-06-01")
	if res, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		var page struct {
			Data []struct{ Type, ID string }
		}
		err := json.NewDecoder(res.Body).Decode(&page)
		res.Body.Close()
		if err != nil || len(page.Data) != 3 || page.Data[0].Type != "model" {
			t.Fatalf("Anthropic's /v1/models: %v %+v", err, page)
		}
	}

	// An unknown model: 404 naming those served.
	code, b := call(t, s, "POST", "/v1/chat/completions", key, map[string]any{"model": "gpt-4o", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	if code != 404 || !strings.Contains(string(b), "deep, stories, wide") {
		t.Fatalf("unknown model: %d %s", code, b)
	}

	// Each model alone; loading the third unloads the least recently used.
	ref := map[string]string{}
	for _, m := range []string{"stories", "wide", "deep"} {
		ref[m] = chatWith(t, s, key, m, "Once upon a time", 12)
	}
	if ref["stories"] == ref["wide"] || ref["wide"] == ref["deep"] {
		t.Fatalf("two models gave the same reply: %q", ref)
	}
	ms = listModels(t, s, key)
	if ms["stories"].State != "unloaded" || ms["wide"].State != "loaded" || ms["deep"].State != "loaded" {
		t.Fatalf("after stories, wide, deep with at most 2 loaded: %+v", ms)
	}

	// Concurrent replies from stories and wide while deep (loaded, idle,
	// least recently used of the two) unloads to make room for stories.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		model := []string{"stories", "wide"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", "http://"+s.addr+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(
				`{"model":%q,"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0,"stream":true}`, model)))
			req.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != 200 || !strings.Contains(string(body), "data: [DONE]") || !strings.Contains(string(body), `"model":"`+model+`"`) {
				errs <- fmt.Errorf("%s: %d %s", model, res.StatusCode, body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ms = listModels(t, s, key)
	if ms["deep"].State != "unloaded" || ms["stories"].State != "loaded" || ms["wide"].State != "loaded" {
		t.Fatalf("after concurrent stories and wide: %+v", ms)
	}
	if got := chatWith(t, s, key, "stories", "Once upon a time", 12); got != ref["stories"] {
		t.Fatalf("stories after the switches: %q, alone: %q", got, ref["stories"])
	}

	// The admin endpoints: the key, then load and unload.
	if code, b := call(t, s, "POST", "/admin/models/deep/load", "", nil); code != 401 {
		t.Fatalf("admin load without the key: %d %s", code, b)
	}
	if code, b := call(t, s, "POST", "/admin/models/deep/load", "carol-key", nil); code != 403 {
		t.Fatalf("admin load with a user's key: %d %s", code, b)
	}
	if code, b := call(t, s, "POST", "/admin/models/deep/load", key, nil); code != 200 || !strings.Contains(string(b), `"state":"loaded"`) {
		t.Fatalf("admin load: %d %s", code, b)
	}
	if code, b := call(t, s, "POST", "/admin/models/nope/unload", key, nil); code != 404 {
		t.Fatalf("admin unload of an unknown model: %d %s", code, b)
	}
	if code, b := call(t, s, "POST", "/admin/models/deep/unload", key, nil); code != 200 {
		t.Fatalf("admin unload: %d %s", code, b)
	}
	waitState(t, s, key, "deep", "unloaded")

	// /health tells each model's state to a key; without one, only that
	// the server is up.
	code, b = call(t, s, "GET", "/health", "carol-key", nil)
	if code != 200 || !strings.Contains(string(b), `{"name":"deep","state":"unloaded"`) {
		t.Fatalf("/health: %d %s", code, b)
	}
	if code, b = call(t, s, "GET", "/health", "", nil); code != 200 || string(b) != `{"status":"ok"}`+"\n" {
		t.Fatalf("/health without a key: %d %q", code, b)
	}

	// Ollama's API: tags lists all three; chat picks by name:tag. A
	// request's keep_alive may lengthen the model's stay, never shorten it
	// (--client-keep-alive extend, the default): 0 from one user does not
	// unload the model the others use, and 1h does not cut the server's
	// --keep-alive -1s (forever) short; /api/ps shows the expiry.
	code, b = call(t, s, "GET", "/api/tags", key, nil)
	for _, n := range []string{"stories:latest", "wide:latest", "deep:latest"} {
		if code != 200 || !strings.Contains(string(b), `"name":"`+n+`"`) {
			t.Fatalf("/api/tags lacks %s: %d %s", n, code, b)
		}
	}
	for _, ka := range []any{"1h", 0} {
		code, b = call(t, s, "POST", "/api/chat", "carol-key", map[string]any{"model": "deep:latest", "stream": false, "keep_alive": ka,
			"messages": []map[string]string{{"role": "user", "content": "Once upon a time"}}, "options": map[string]any{"num_predict": 8, "temperature": 0}})
		if code != 200 || !strings.Contains(string(b), `"model":"deep:latest"`) {
			t.Fatalf("/api/chat with deep:latest, keep_alive %v: %d %s", ka, code, b)
		}
	}
	if st := listModels(t, s, key)["deep"].State; st != "loaded" {
		t.Fatalf("a user's keep_alive 0 unloaded deep for everyone: %s", st)
	}
	code, b = call(t, s, "GET", "/api/ps", key, nil)
	var ps struct {
		Models []struct {
			Name      string
			Size      int64
			ExpiresAt time.Time `json:"expires_at"`
		}
	}
	if code != 200 || json.Unmarshal(b, &ps) != nil {
		t.Fatalf("/api/ps: %d %s", code, b)
	}
	found := false
	for _, m := range ps.Models {
		if m.Name == "deep:latest" {
			found = true
			if left := time.Until(m.ExpiresAt); left < 24*time.Hour || m.Size != ms["deep"].SizeBytes {
				t.Fatalf("deep in /api/ps: expires in %v (want far ahead: forever), size %d: %s", left, m.Size, b)
			}
		}
	}
	if !found || len(ps.Models) != 2 {
		t.Fatalf("/api/ps: %s", b)
	}

	// Metrics by model.
	code, b = call(t, s, "GET", "/metrics", key, nil)
	for _, want := range []string{`parley_model_replies_total{finish="length",model="stories"} `, `parley_model_replies_total{finish="length",model="deep"} `,
		`parley_model_loaded{model="deep"} 1`, `parley_model_replies_in_flight{model="wide"} 0`, `parley_model_time_to_first_token_seconds_count{model="wide"} `} {
		if code != 200 || !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestModelsBudgetAndPin(t *testing.T) {
	bin := testbin.Parley(t)
	dir := modelsDir(t)
	huge := synthModel(t, t.TempDir(), "huge", 8, 512)
	file := filepath.Join(t.TempDir(), "models.json")
	cfg := fmt.Sprintf(`{"models": [
		{"name": "stories", "path": %q, "pin": true, "load": true, "default": true},
		{"name": "wide", "path": %q, "keep_alive": -1},
		{"name": "deep", "path": %q, "ctx": 384, "keep_alive": "1h"},
		{"name": "huge", "path": %q}
	]}`, filepath.Join(dir, "stories.gguf"), filepath.Join(dir, "wide.gguf"), filepath.Join(dir, "deep.gguf"), huge)
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// First without a budget, for the estimates.
	probe := launch(t, bin, "--models-file", file, "--store", "memory")
	est := listModels(t, probe, "")
	probe.Kill()
	// Room for stories and one of wide and deep, not both, and never huge.
	budget := est["stories"].SizeBytes + max(est["wide"].SizeBytes, est["deep"].SizeBytes) + 1<<10
	if budget >= est["stories"].SizeBytes+est["wide"].SizeBytes+est["deep"].SizeBytes || est["huge"].SizeBytes <= budget {
		t.Fatalf("the estimates do not make the test: %+v", est)
	}

	s := launch(t, bin, "--models-file", file, "--store", "memory", "--max-models-memory", fmt.Sprint(budget))
	waitState(t, s, "", "stories", "loaded") // load: true
	if ms := listModels(t, s, ""); !ms["stories"].Pinned || ms["deep"].Settings["ctx"] != float64(384) {
		t.Fatalf("the models file's settings: %+v", ms)
	}
	base := rssBytes(t, s.Cmd.Process.Pid)
	var peak int64
	for i := 0; i < 3; i++ {
		for _, m := range []string{"wide", "deep"} {
			chatWith(t, s, "", m, "Once upon a time", 8)
			ms := listModels(t, s, "")
			var used int64
			for _, m := range ms {
				if m.State != "unloaded" {
					used += m.SizeBytes
				}
			}
			if used > budget {
				t.Fatalf("resident estimates %d over the budget %d: %+v", used, budget, ms)
			}
			if ms["stories"].State != "loaded" {
				t.Fatalf("the pinned model was unloaded: %+v", ms)
			}
			rss := rssBytes(t, s.Cmd.Process.Pid)
			t.Logf("after %s: RSS %.1f MiB", m, float64(rss)/(1<<20))
			peak = max(peak, rss)
		}
	}
	// The budget holds in the process's memory too: six switches cost no
	// more than the budget above what the pinned model alone took (the
	// weights of an unloaded model are unmapped, its KV cache freed).
	t.Logf("RSS: %d MiB with the pinned model, at most %d MiB over six switches; budget %d MiB", base>>20, peak>>20, budget>>20)
	if peak > base+budget {
		t.Fatalf("RSS reached %d MiB, over %d MiB with stories alone + the budget %d MiB", peak>>20, base>>20, budget>>20)
	}
	if n := loads(s, "stories"); n != 1 {
		t.Fatalf("the pinned model loaded %d times", n)
	}

	// A model over the whole budget: refused before it loads, with figures.
	code, b := call(t, s, "POST", "/v1/chat/completions", "", map[string]any{"model": "huge", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	if code != 413 || !strings.Contains(string(b), "MiB") || !strings.Contains(string(b), "budget") || !strings.Contains(string(b), "KV cache") {
		t.Fatalf("huge: %d %s", code, b)
	}
	if loads(s, "huge") != 0 || listModels(t, s, "")["huge"].State != "unloaded" {
		t.Fatal("the model over the budget was loaded")
	}
}

// dialModel opens a JSON-mode chat socket with query and returns it and its
// session message.
func dialModel(t *testing.T, s *server, query string) (*websocket.Conn, jsonmode.Message) {
	t.Helper()
	ws := s.dial(t, query)
	m := read(t, ws)
	if m.Type != "session" {
		t.Fatalf("first message: %+v", m)
	}
	return ws, m
}

// turnLoading is turn that also takes loading messages, and returns them.
func turnLoading(t *testing.T, ws *websocket.Conn, prompt string, model ...string) (jsonmode.Message, []jsonmode.Message) {
	t.Helper()
	msg := map[string]any{"type": "prompt", "content": prompt, "params": map[string]any{"max_tokens": 8, "temperature": 0}}
	if len(model) > 0 {
		msg["model"] = model[0]
	}
	ws.WriteJSON(msg)
	var loading []jsonmode.Message
	for {
		m := read(t, ws)
		switch m.Type {
		case "token":
		case "loading":
			loading = append(loading, m)
		case "done", "error":
			return m, loading
		default:
			t.Fatalf("during the reply to %q: %+v", prompt, m)
		}
	}
}

func TestSessionRemembersItsModel(t *testing.T) {
	bin := testbin.Parley(t)
	dir := modelsDir(t)
	data := t.TempDir()
	// keep-alive 0: a model unloads when its reply ends, so each turn loads
	// the model it runs on, and the log says which.
	s := launch(t, bin, "--models", dir, "--keep-alive", "0s", "--store", "bolt", "--data-dir", data)
	ws, sess := dialModel(t, s, "&model=wide")
	id := sess.SessionID()
	if sess.Model != "wide" {
		t.Fatalf("session message: %+v", sess)
	}
	done, loading := turnLoading(t, ws, "Once upon a time")
	if done.Type != "done" || len(loading) == 0 || loading[0].Model != "wide" {
		t.Fatalf("first turn: %+v, loading %+v", done, loading)
	}
	ws.Close()
	waitState(t, s, "", "wide", "unloaded")

	// Resumed with no model, or another one: the session's own.
	ws, sess = dialModel(t, s, "&model=deep&session="+id)
	if !sess.Resumed || sess.Model != "wide" {
		t.Fatalf("resumed session: %+v", sess)
	}
	if done, _ := turnLoading(t, ws, "and then"); done.Type != "done" {
		t.Fatalf("resumed turn: %+v", done)
	}
	if loads(s, "wide") != 2 || loads(s, "deep") != 0 || loads(s, "stories") != 0 {
		t.Fatalf("loads: wide %d, deep %d, stories %d; want the session's model twice", loads(s, "wide"), loads(s, "deep"), loads(s, "stories"))
	}
	ws.Close()

	// The prompt's model field picks a new session's model; a session
	// with a history keeps its own.
	ws, _ = dialModel(t, s, "&model=stories")
	if done, _ := turnLoading(t, ws, "Once upon a time", "deep"); done.Type != "done" || loads(s, "deep") != 1 || loads(s, "stories") != 0 {
		t.Fatalf("a first prompt naming deep: %+v (loads: deep %d, stories %d)", done, loads(s, "deep"), loads(s, "stories"))
	}
	if done, _ := turnLoading(t, ws, "and then", "wide"); done.Type != "error" || done.Field != "model" || !strings.Contains(done.Message, `held with model "deep"`) {
		t.Fatalf("a later prompt naming another model: %+v", done)
	}
	ws.Close()

	// The Responses API: a chain keeps the model it began with.
	code, b := call(t, s, "POST", "/v1/responses", "", map[string]any{"model": "deep", "input": "Once upon a time", "max_output_tokens": 8})
	var r1 struct{ ID, Model string }
	if code != 200 || json.Unmarshal(b, &r1) != nil || r1.Model != "deep" {
		t.Fatalf("a response from deep: %d %s", code, b)
	}
	code, b = call(t, s, "POST", "/v1/responses", "", map[string]any{"model": "stories", "input": "and then", "previous_response_id": r1.ID, "max_output_tokens": 8})
	var r2 struct{ Model string }
	if code != 200 || json.Unmarshal(b, &r2) != nil || r2.Model != "deep" || loads(s, "deep") != 3 || loads(s, "stories") != 0 {
		t.Fatalf("a chained response naming stories: %d %s (loads: deep %d, stories %d)", code, b, loads(s, "deep"), loads(s, "stories"))
	}
	s.Kill()

	// The same sessions, served without wide: a clear error.
	only := t.TempDir()
	if err := os.Rename(filepath.Join(dir, "stories.gguf"), filepath.Join(only, "stories.gguf")); err != nil {
		t.Fatal(err)
	}
	// And a damaged GGUF beside it: an error for that model alone.
	b, err := os.ReadFile(filepath.Join(only, "stories.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(only, "broken.gguf"), b[:5000], 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := launch(t, bin, "--models", only, "--store", "bolt", "--data-dir", data)
	code, b = call(t, s2, "POST", "/v1/chat/completions", "", map[string]any{"model": "broken", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	if code != 503 || !strings.Contains(string(b), `model \"broken\" cannot be loaded`) || !strings.Contains(string(b), "broken.gguf") {
		t.Fatalf("a damaged model: %d %s", code, b)
	}
	if lm := listModels(t, s2, "")["broken"]; lm.State != "unloaded" || !strings.Contains(lm.LastError, "broken.gguf") {
		t.Fatalf("the damaged model in /v1/models: %+v", lm)
	}
	chatWith(t, s2, "", "stories", "Once upon a time", 4) // the others serve
	ws, sess = dialModel(t, s2, "&session="+id)
	if !sess.Resumed || sess.Model != "wide" {
		t.Fatalf("resumed on a server without its model: %+v", sess)
	}
	done, _ = turnLoading(t, ws, "and then")
	if done.Type != "error" || done.Code != "not_found" || !strings.Contains(done.Message, `model "wide", which this server no longer serves`) {
		t.Fatalf("a turn whose model is gone: %+v", done)
	}
}

// TestMinResidencyDampsThrash: with room for one model, a request for
// another does not unload the one loaded within its minimum residency: it
// waits in its model's queue (here until its client gives up), and the
// model that serves stays loaded, loaded once.
func TestMinResidencyDampsThrash(t *testing.T) {
	bin := testbin.Parley(t)
	s := launch(t, bin, "--models", modelsDir(t), "--max-loaded-models", "1", "--keep-alive", "-1s", "--min-residency", "1h", "--store", "memory")
	chatWith(t, s, "", "stories", "Once upon a time", 4)
	body, _ := json.Marshal(map[string]any{"model": "wide", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		t.Fatalf("a request for another model was answered within stories' residency: %d %s", res.StatusCode, b)
	}
	chatWith(t, s, "", "stories", "Once upon a time", 4)
	if ms := listModels(t, s, ""); ms["stories"].State != "loaded" || ms["wide"].State != "unloaded" || loads(s, "stories") != 1 || loads(s, "wide") != 0 {
		t.Fatalf("after a request for wide within stories' residency: %+v, loads %d/%d", ms, loads(s, "stories"), loads(s, "wide"))
	}
}
