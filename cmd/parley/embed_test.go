package main

// Embeddings and rerank beside a chat model, end to end: the real binary
// serving stories260K (--model, the default) and a synthetic embedding
// model and reranker (--models), over real sockets. Their outputs are
// compared with llama.cpp's own embedding tool's (llm/testdata).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// embedReference is what llm/testdata/embedding-reference.json holds.
type embedReference struct {
	Inputs    []string `json:"inputs"`
	Query     string   `json:"query"`
	Documents []string `json:"documents"`
	Models    map[string]struct {
		Description string      `json:"description"`
		L2          [][]float64 `json:"l2"`
		Scores      []float64   `json:"scores"`
	} `json:"models"`
}

// embedModels writes the reference's bert-mean and bert-rank (the shapes
// scripts/embedding-reference.sh gives tools/mkgguf) to a new folder.
func embedModels(t *testing.T, ref embedReference) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"bert-mean", "bert-rank"} {
		s := synth.DefaultSpec()
		s.Name, s.VocabFrom = name, testmodel.Path(t)
		s.Layers, s.Dim, s.Heads, s.KVHeads, s.FFN, s.Context = 2, 64, 4, 4, 128, 512
		s.Std, s.ResidStd, s.Type, s.Arch, s.Pooling = 0.2, 0.2, "f32", "bert", strings.TrimPrefix(name, "bert-")
		if got, want := s.Description(), ref.Models[name].Description; got != want {
			t.Fatalf("%s: the test's spec is %q, the reference's %q", name, got, want)
		}
		if _, err := synth.Write(context.Background(), filepath.Join(dir, name+".gguf"), s); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readEmbedReference(t *testing.T) embedReference {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "llm", "testdata", "embedding-reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref embedReference
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

func TestEmbeddingsBesideChat(t *testing.T) {
	bin := testbin.Parley(t)
	ref := readEmbedReference(t)
	const key = "embed-key"
	s := start(t, bin, "--models", embedModels(t, ref), "--api-key", key, "--user", "dave:dave-key", "--store", "memory")

	// The key guards the endpoints as it guards chat.
	if code, b := call(t, s, "POST", "/v1/embeddings", "", map[string]any{"model": "bert-mean", "input": "hi"}); code != 401 {
		t.Fatalf("without a key: %d %s", code, b)
	}

	// A chat model asked for embeddings: a 400 that says why, in each
	// API's shape, and the model is not loaded for it.
	chatName := strings.TrimSuffix(filepath.Base(testmodel.Path(t)), ".gguf")
	for _, path := range []string{"/v1/embeddings", "/api/embed"} {
		code, b := call(t, s, "POST", path, "dave-key", map[string]any{"model": chatName, "input": "hi"})
		if code != 400 || !strings.Contains(string(b), "not an embedding model") {
			t.Fatalf("%s on the chat model: %d %s", path, code, b)
		}
	}
	if st := listModels(t, s, key)[chatName].State; st != "unloaded" {
		t.Fatalf("the chat model after embeddings were asked of it: %s, want unloaded", st)
	}

	// OpenAI's /v1/embeddings: llama.cpp's normalized vectors.
	code, b := call(t, s, "POST", "/v1/embeddings", "dave-key", map[string]any{"model": "bert-mean", "input": ref.Inputs})
	if code != 200 {
		t.Fatalf("/v1/embeddings: %d %s", code, b)
	}
	var oa struct {
		Model string
		Data  []struct {
			Index     int
			Embedding []float64
		}
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	if err := json.Unmarshal(b, &oa); err != nil || oa.Model != "bert-mean" || len(oa.Data) != len(ref.Inputs) || oa.Usage.PromptTokens == 0 {
		t.Fatalf("/v1/embeddings: %v %s", err, b)
	}
	for i, d := range oa.Data {
		if d.Index != i || !vectorsNear(d.Embedding, ref.Models["bert-mean"].L2[i]) {
			t.Fatalf("input %d: %v, want llama.cpp's %v", i, d.Embedding, ref.Models["bert-mean"].L2[i])
		}
	}
	// Ollama's /api/embed, by an Ollama-style name: the same vectors.
	code, b = call(t, s, "POST", "/api/embed", "dave-key", map[string]any{"model": "bert-mean:latest", "input": ref.Inputs[:2]})
	var ol struct{ Embeddings [][]float64 }
	if err := json.Unmarshal(b, &ol); code != 200 || err != nil || len(ol.Embeddings) != 2 || !vectorsNear(ol.Embeddings[1], ref.Models["bert-mean"].L2[1]) {
		t.Fatalf("/api/embed: %d %s", code, b)
	}

	// Ollama's keep_alive holds the model as it does for chat (the default
	// policy, extend: past the model's own 5 minutes), and a bad one is a
	// 400 naming it.
	if code, b := call(t, s, "POST", "/api/embed", "dave-key", map[string]any{"model": "bert-mean", "input": "hi", "keep_alive": "2h"}); code != 200 {
		t.Fatalf("/api/embed with keep_alive: %d %s", code, b)
	}
	_, b = call(t, s, "GET", "/v1/models/bert-mean", key, nil)
	var held struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(b, &held); err != nil || time.Until(held.ExpiresAt) < time.Hour {
		t.Fatalf("bert-mean after keep_alive 2h: %v %s", err, b)
	}
	if code, b := call(t, s, "POST", "/api/embed", "dave-key", map[string]any{"model": "bert-mean", "input": "hi", "keep_alive": "soon"}); code != 400 || !strings.Contains(string(b), "keep_alive") {
		t.Fatalf("/api/embed with a bad keep_alive: %d %s", code, b)
	}

	// An input over the model's 512 tokens per input: OpenAI's endpoint
	// refuses it, Ollama's cuts it (its default); llama.cpp never sees it.
	long := strings.Repeat("Once upon a time there was a little cat. ", 80)
	if code, b := call(t, s, "POST", "/v1/embeddings", "dave-key", map[string]any{"model": "bert-mean", "input": long}); code != 400 || !strings.Contains(string(b), "at most 512") {
		t.Fatalf("an over-long input on /v1/embeddings: %d %s", code, b)
	}
	code, b = call(t, s, "POST", "/api/embed", "dave-key", map[string]any{"model": "bert-mean", "input": long})
	var cut struct {
		Embeddings      [][]float64
		PromptEvalCount int `json:"prompt_eval_count"`
	}
	if err := json.Unmarshal(b, &cut); code != 200 || err != nil || len(cut.Embeddings) != 1 || cut.PromptEvalCount != 512 {
		t.Fatalf("an over-long input on /api/embed: %d %.300s", code, b)
	}

	// Rerank on each of llama-server's paths: llama.cpp's scores, best first.
	scores := ref.Models["bert-rank"].Scores
	for _, path := range []string{"/v1/rerank", "/v1/reranking", "/rerank", "/reranking"} {
		code, b := call(t, s, "POST", path, "dave-key", map[string]any{"model": "bert-rank", "query": ref.Query, "documents": ref.Documents, "top_n": 2})
		var rr struct {
			Results []struct {
				Index          int
				RelevanceScore float64 `json:"relevance_score"`
			}
		}
		if err := json.Unmarshal(b, &rr); code != 200 || err != nil || len(rr.Results) != 2 {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		for _, r := range rr.Results {
			if math.Abs(r.RelevanceScore-scores[r.Index]) > 1e-4+1e-4*math.Abs(scores[r.Index]) {
				t.Fatalf("%s: document %d scored %g, llama.cpp %g", path, r.Index, r.RelevanceScore, scores[r.Index])
			}
		}
		if rr.Results[0].RelevanceScore < rr.Results[1].RelevanceScore {
			t.Fatalf("%s: results not best first: %s", path, b)
		}
	}

	// A request that names no model (llama-server's clients' habit) gets
	// the one model that fits its endpoint, not the default chat model.
	if code, b := call(t, s, "POST", "/reranking", "dave-key", map[string]any{"query": ref.Query, "documents": ref.Documents}); code != 200 || !strings.Contains(string(b), `"model":"bert-rank"`) {
		t.Fatalf("rerank without a model: %d %s", code, b)
	}
	if code, b := call(t, s, "POST", "/v1/embeddings", "dave-key", map[string]any{"input": "hi"}); code != 200 || !strings.Contains(string(b), `"model":"bert-mean"`) {
		t.Fatalf("embeddings without a model: %d %.200s", code, b)
	}

	// Ollama's /api/show says what each model does.
	for name, want := range map[string]string{"bert-mean": `["embedding"]`, chatName: `["completion"`} {
		if code, b := call(t, s, "POST", "/api/show", key, map[string]any{"model": name}); code != 200 || !strings.Contains(string(b), `"capabilities":`+want) {
			t.Fatalf("/api/show %s: %d %.300s, want capabilities %s", name, code, b, want)
		}
	}

	// Each model has its own residency: both loaded now, the chat model
	// still not; and chat works beside them.
	ms := listModels(t, s, key)
	if ms["bert-mean"].State != "loaded" || ms["bert-rank"].State != "loaded" || ms[chatName].State != "unloaded" {
		t.Fatalf("residency after embeddings and rerank: %+v", ms)
	}
	if got := chatWith(t, s, key, chatName, "Once upon a time", 8); got == "" {
		t.Fatal("no chat reply beside the embedding models")
	}
	// Chat asked of an embedding model: a 400, not a crash.
	if code, b := call(t, s, "POST", "/v1/chat/completions", key, map[string]any{"model": "bert-mean",
		"messages": []map[string]string{{"role": "user", "content": "hi"}}}); code != 400 || !strings.Contains(string(b), "embedding model") {
		t.Fatalf("chat with an embedding model: %d %s", code, b)
	}

	t.Run("chat streams while a large batch embeds", func(t *testing.T) {
		chatStreamBesideEmbeddings(t, s, key, chatName)
	})
}

// chatStreamBesideEmbeddings starts a large embedding request (128 inputs
// of about 360 tokens: 46,000 tokens, about a hundred micro-batches) and,
// once the server holds it, a streamed chat reply of 32 tokens: every one of the chat's tokens arrives, and its reply ends,
// before the embeddings' reply does. The two models' loops run side by
// side; neither waits for the other.
func chatStreamBesideEmbeddings(t *testing.T, s *server, key, chatName string) {
	inputs := make([]string, 128)
	for i := range inputs {
		inputs[i] = strings.Repeat("Once upon a time there was a little cat. ", 30)[i%7:]
	}
	type result struct {
		code int
		n    int
	}
	embedded := make(chan result, 1)
	body, _ := json.Marshal(map[string]any{"model": "bert-mean", "input": inputs})
	go func() {
		req, _ := http.NewRequest("POST", "http://"+s.addr+"/v1/embeddings", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer dave-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			embedded <- result{code: -1}
			return
		}
		defer res.Body.Close()
		var r struct{ Data []json.RawMessage }
		_ = json.NewDecoder(res.Body).Decode(&r)
		embedded <- result{res.StatusCode, len(r.Data)}
	}()
	// The embedding request is in the engine once its model counts it in
	// flight.
	for ms := listModels(t, s, key); ms["bert-mean"].InFlight == 0; ms = listModels(t, s, key) {
		select {
		case r := <-embedded:
			t.Fatalf("the embeddings ended (%d, %d vectors) before the chat started: make the batch larger", r.code, r.n)
		default:
		}
	}

	body, _ = json.Marshal(map[string]any{"model": chatName, "stream": true, "max_tokens": 32, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": "Once upon a time"}}})
	req, _ := http.NewRequest("POST", "http://"+s.addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	tokens, finished := 0, ""
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta        struct{ Content string }
				FinishReason string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil || len(chunk.Choices) == 0 {
			continue
		}
		if chunk.Choices[0].Delta.Content != "" {
			tokens++
		}
		if f := chunk.Choices[0].FinishReason; f != "" {
			finished = f
		}
	}
	select {
	case r := <-embedded:
		t.Fatalf("the embeddings (%d, %d vectors) ended before the chat's reply: %d tokens, finish %q", r.code, r.n, tokens, finished)
	default:
	}
	if finished != "length" || tokens < 16 {
		t.Fatalf("the chat beside the embeddings: %d content chunks, finish %q", tokens, finished)
	}
	if r := <-embedded; r.code != 200 || r.n != len(inputs) {
		t.Fatalf("the large embedding request: %d, %d vectors", r.code, r.n)
	}
}

// vectorsNear reports whether got equals want within float32 rounding of
// the reference tool's printed decimals.
func vectorsNear(got, want []float64) bool {
	if len(got) != len(want) || len(want) == 0 {
		return false
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-4+1e-4*math.Abs(want[i]) {
			return false
		}
	}
	return true
}

// TestEmbeddingModelAlone serves one embedding model as the one --model,
// with the per-client limits chat has: users share the model's loop fairly
// (one user's large request does not hold back another's small one) and
// one user's requests past its share of the queue are refused, as chat's
// are, while another user's are taken.
func TestEmbeddingModelAlone(t *testing.T) {
	bin := testbin.Parley(t)
	ref := readEmbedReference(t)
	model := filepath.Join(embedModels(t, ref), "bert-mean.gguf")
	const key = "alone-key"
	s := launch(t, bin, "--model", model, "--api-key", key, "--user", "dave:dave-key", "--user", "erin:erin-key",
		"--queue-per-client", "1", "--store", "memory")

	// The one model answers whatever the model field says, under its own
	// name when the request names none; chat is refused.
	code, b := call(t, s, "POST", "/v1/embeddings", "erin-key", map[string]any{"input": ref.Inputs[1]})
	if code != 200 || !strings.Contains(string(b), `"model":"bert-mean"`) {
		t.Fatalf("embeddings from the one model: %d %.200s", code, b)
	}
	if code, b := call(t, s, "POST", "/v1/chat/completions", key, map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}}); code != 400 {
		t.Fatalf("chat with an embedding model: %d %s", code, b)
	}

	big := make([]string, 128)
	for i := range big {
		big[i] = strings.Repeat("Once upon a time there was a little cat. ", 30)[i%7:]
	}
	type reply struct {
		code int
		body string
	}
	post := func(user string, inputs []string) <-chan reply {
		ch := make(chan reply, 1)
		body, _ := json.Marshal(map[string]any{"model": "bert-mean", "input": inputs})
		go func() {
			req, _ := http.NewRequest("POST", "http://"+s.addr+"/v1/embeddings", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+user+"-key")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				ch <- reply{-1, err.Error()}
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			ch <- reply{res.StatusCode, string(b)}
		}()
		return ch
	}
	// gauge waits until the engine's gauge (parley_generations_active or
	// _queued) reaches n, failing when done answers first.
	gauge := func(name string, n int, done <-chan reply) {
		t.Helper()
		for {
			select {
			case r := <-done:
				t.Fatalf("a large request ended (%d) before %s reached %d: make it larger", r.code, name, n)
			default:
			}
			_, m := call(t, s, "GET", "/metrics", key, nil)
			for _, line := range strings.Split(string(m), "\n") {
				if v, ok := strings.CutPrefix(line, name+" "); ok {
					if got, _ := strconv.Atoi(v); got >= n {
						return
					}
				}
			}
		}
	}

	// Dave's large request holds a slot; Erin's one input is answered while
	// it runs: the loop packs each batch with both requests' inputs in turn.
	a := post("dave", big)
	gauge("parley_generations_active", 1, a)
	if r := <-post("erin", ref.Inputs[:1]); r.code != 200 {
		t.Fatalf("erin's request beside dave's: %d %s", r.code, r.body)
	}
	select {
	case r := <-a:
		t.Fatalf("dave's large request (%d) ended before erin's one input", r.code)
	default:
	}
	// Dave's second large request takes the other slot (--parallel 2), his
	// third waits, and his fourth is past his share of the queue
	// (--queue-per-client 1): refused, while Erin's is taken.
	b2 := post("dave", big)
	gauge("parley_generations_active", 2, a)
	c := post("dave", ref.Inputs[:1])
	gauge("parley_generations_queued", 1, a)
	if r := <-post("dave", ref.Inputs[:1]); r.code != 503 || !strings.Contains(r.body, "as many requests waiting") {
		t.Fatalf("dave's request past his share of the queue: %d %s", r.code, r.body)
	}
	e := post("erin", ref.Inputs[:1])
	for name, ch := range map[string]<-chan reply{"dave's first": a, "dave's second": b2, "dave's third": c, "erin's second": e} {
		if r := <-ch; r.code != 200 {
			t.Fatalf("%s: %d %.300s", name, r.code, r.body)
		}
	}
}
