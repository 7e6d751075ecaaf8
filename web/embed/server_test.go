package embed_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/web/embed"
)

// The handlers end to end: the real engine on synthetic models
// (llm/embed_test.go's, whose llama.cpp outputs the reference holds), over
// a real socket.

func openModel(t *testing.T, name string, cfg llm.Config) *llm.Engine {
	t.Helper()
	cfg.Engine, cfg.Threads = llm.EngineEmbedded, 2
	if cfg.Path == "" {
		s := synth.DefaultSpec()
		s.Name, s.VocabFrom = name, testmodel.Path(t)
		s.Layers, s.Dim, s.Heads, s.KVHeads, s.FFN, s.Context = 2, 64, 4, 4, 128, 512
		s.Std, s.ResidStd, s.Type, s.Arch, s.Pooling = 0.2, 0.2, "f32", "bert", strings.TrimPrefix(name, "bert-")
		cfg.Path = filepath.Join(t.TempDir(), name+".gguf")
		if _, err := synth.Write(context.Background(), cfg.Path, s); err != nil {
			t.Fatal(err)
		}
	}
	e, err := llm.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

type server struct {
	*httptest.Server
	released int
}

func newServer(t *testing.T) (*server, map[string]*llm.Engine) {
	models := map[string]*llm.Engine{
		"bert-mean": openModel(t, "bert-mean", llm.Config{ContextLength: 512, BatchSize: 96}),
		"bert-rank": openModel(t, "bert-rank", llm.Config{ContextLength: 512}),
		"chat":      openModel(t, "chat", llm.Config{Path: testmodel.Path(t), ContextLength: 256}),
	}
	s := &server{}
	lookup := func(r *http.Request, name string, _ *time.Duration) (embed.Target, error) {
		e, ok := models[name]
		if !ok {
			return embed.Target{}, parley.Errorf(parley.ENotFound, "no model %q", name)
		}
		i := e.EmbedInfo()
		return embed.Target{Name: name, Model: e, Info: embed.Info{Pooling: i.Pooling, Dimensions: i.Dimensions, MaxTokens: i.MaxTokens},
			Release: func() { s.released++ }}, nil
	}
	writeErr := func(w http.ResponseWriter, r *http.Request, api embed.API, err error) {
		status := map[string]int{parley.EInvalid: 400, parley.ETooLarge: 413, parley.ENotFound: 404}[parley.ErrorCode(err)]
		if status == 0 {
			status = 500
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]any{"error": parley.ErrorMessage(err), "api": int(api)})
	}
	h := embed.New(lookup, writeErr, embed.WithMaxInputs(8))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/embeddings", h.OpenAIEmbeddings)
	mux.HandleFunc("POST /api/embed", h.OllamaEmbed)
	mux.HandleFunc("POST /api/embeddings", h.OllamaEmbeddings)
	mux.HandleFunc("POST /v1/rerank", h.Rerank)
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s, models
}

// post sends body and decodes the reply into out, returning the status and
// the raw reply.
func (s *server) post(t *testing.T, path, body string, out any) (int, string) {
	t.Helper()
	resp, err := http.Post(s.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

func near(got []float32, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > tol {
			return fmt.Errorf("value %d: %g, want %g", i, got[i], want[i])
		}
	}
	return nil
}

func TestEndpoints(t *testing.T) {
	ref := readReference(t)
	var full struct {
		Inputs    []string `json:"inputs"`
		Query     string   `json:"query"`
		Documents []string `json:"documents"`
		Models    map[string]struct {
			Scores []float64 `json:"scores"`
		} `json:"models"`
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "llm", "testdata", "embedding-reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &full); err != nil {
		t.Fatal(err)
	}
	s, models := newServer(t)
	mean := ref.Models["bert-mean"]
	inputs, _ := json.Marshal(full.Inputs)

	t.Run("openai", func(t *testing.T) {
		var resp embed.OpenAIResponse
		if st, body := s.post(t, "/v1/embeddings", `{"model":"bert-mean","input":`+string(inputs)+`}`, &resp); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
		if resp.Model != "bert-mean" || len(resp.Data) != len(full.Inputs) || resp.Usage.PromptTokens == 0 {
			t.Fatalf("%+v", resp)
		}
		var ids [][]int
		for i, d := range resp.Data {
			v := floats(t, d.Embedding)
			if err := near(v, mean.L2[i], 1e-4); err != nil {
				t.Fatalf("input %d: %v", i, err)
			}
			toks, _ := models["bert-mean"].EmbedTokenize(context.Background(), full.Inputs[i])
			ids = append(ids, toks)
		}
		// Token ids, base64 and dimensions.
		idsJSON, _ := json.Marshal(ids)
		var b64 embed.OpenAIResponse
		if st, body := s.post(t, "/v1/embeddings", `{"model":"bert-mean","input":`+string(idsJSON)+`,"encoding_format":"base64","dimensions":16}`, &b64); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
		if b64.Usage.PromptTokens != resp.Usage.PromptTokens {
			t.Fatalf("usage %d by ids, %d by text", b64.Usage.PromptTokens, resp.Usage.PromptTokens)
		}
		for i, d := range b64.Data {
			bs, err := base64.StdEncoding.DecodeString(d.Embedding.(string))
			if err != nil || len(bs) != 64 {
				t.Fatalf("input %d: %d bytes, %v", i, len(bs), err)
			}
			// The first 16 of the normalized vector, normalized again.
			want, n := mean.L2[i][:16], 0.0
			for _, x := range want {
				n += x * x
			}
			scaled := make([]float64, 16)
			for j, x := range want {
				scaled[j] = x / math.Sqrt(n)
			}
			if err := near(decodeB64(bs), scaled, 1e-4); err != nil {
				t.Fatalf("input %d, dimensions 16: %v", i, err)
			}
		}
		// Refusals: a chat model, a reranker, an unknown model, too many
		// inputs, an input over the micro-batch (96 tokens).
		for _, tc := range []struct{ body, want string }{
			{`{"model":"chat","input":"hi"}`, "not an embedding model"},
			{`{"model":"bert-rank","input":"hi"}`, "/v1/rerank"},
			{`{"model":"nope","input":"hi"}`, "no model"},
			{`{"model":"bert-mean","input":["a","b","c","d","e","f","g","h","i"]}`, "at most 8"},
			{`{"model":"bert-mean","input":"` + strings.Repeat("word ", 100) + `"}`, "at most 96"},
			{`{"model":"bert-mean","input":[[1,2,99999999]]}`, "outside the vocabulary"},
			{`{"model":"bert-mean","input":`, "not valid JSON"},
		} {
			if st, body := s.post(t, "/v1/embeddings", tc.body, nil); st == 200 || !strings.Contains(body, tc.want) {
				t.Fatalf("%.60s: %d %s, want an error with %q", tc.body, st, body, tc.want)
			}
		}
	})

	t.Run("ollama", func(t *testing.T) {
		var resp embed.OllamaEmbedResponse
		if st, body := s.post(t, "/api/embed", `{"model":"bert-mean","input":`+string(inputs)+`}`, &resp); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
		for i, v := range resp.Embeddings {
			if err := near(v, mean.L2[i], 1e-4); err != nil {
				t.Fatalf("input %d: %v", i, err)
			}
		}
		long := `"` + strings.Repeat("word ", 100) + `"`
		if st, body := s.post(t, "/api/embed", `{"model":"bert-mean","input":`+long+`}`, &resp); st != 200 || resp.PromptEvalCount != 96 || len(resp.Embeddings) != 1 {
			t.Fatalf("a long input, truncated by default: %d %s", st, body)
		}
		if st, body := s.post(t, "/api/embed", `{"model":"bert-mean","input":`+long+`,"truncate":false}`, nil); st == 200 || !strings.Contains(body, "at most 96") {
			t.Fatalf("truncate false: %d %s", st, body)
		}
		if st, body := s.post(t, "/api/embed", `{"model":"bert-mean","input":""}`, &resp); st != 200 || len(resp.Embeddings) != 0 || !strings.Contains(body, `"embeddings":[]`) {
			t.Fatalf("an empty input: %d %s", st, body)
		}
		var old embed.OllamaEmbeddingsResponse
		prompt, _ := json.Marshal(full.Inputs[1])
		if st, body := s.post(t, "/api/embeddings", `{"model":"bert-mean","prompt":`+string(prompt)+`}`, &old); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
		got := make([]float32, len(old.Embedding))
		for i, x := range old.Embedding {
			got[i] = float32(x)
		}
		if err := near(got, mean.Raw[1], 2e-4); err != nil {
			t.Fatalf("/api/embeddings, raw: %v", err)
		}
	})

	t.Run("rerank", func(t *testing.T) {
		docs, _ := json.Marshal(full.Documents)
		var resp embed.RerankResponse
		body := fmt.Sprintf(`{"model":"bert-rank","query":%q,"documents":%s,"top_n":2,"return_documents":true}`, full.Query, docs)
		if st, b := s.post(t, "/v1/rerank", body, &resp); st != 200 {
			t.Fatalf("%d %s", st, b)
		}
		scores := full.Models["bert-rank"].Scores
		best, second := 0, 1
		for i := range scores {
			if scores[i] > scores[best] {
				best = i
			}
		}
		if best == second {
			second = 0
		}
		for i := range scores {
			if i != best && scores[i] > scores[second] {
				second = i
			}
		}
		if len(resp.Results) != 2 || resp.Results[0].Index != best || resp.Results[1].Index != second {
			t.Fatalf("results %+v, llama.cpp's scores %v", resp.Results, scores)
		}
		for _, r := range resp.Results {
			if math.Abs(r.RelevanceScore-scores[r.Index]) > 2e-4 || r.Document == nil || r.Document.Text != full.Documents[r.Index] {
				t.Fatalf("result %+v, llama.cpp's score %g", r, scores[r.Index])
			}
		}
		if st, b := s.post(t, "/v1/rerank", `{"model":"bert-mean","query":"q","documents":["d"]}`, nil); st == 200 || !strings.Contains(b, "not a reranker") {
			t.Fatalf("rerank on an embedding model: %d %s", st, b)
		}
	})
	if s.released == 0 {
		t.Fatal("no Target was released")
	}
}

func floats(t *testing.T, v any) []float32 {
	t.Helper()
	xs, ok := v.([]any)
	if !ok {
		t.Fatalf("embedding %T, want a list", v)
	}
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x.(float64))
	}
	return out
}

func decodeB64(bs []byte) []float32 {
	out := make([]float32, len(bs)/4)
	for i := range out {
		out[i] = math.Float32frombits(uint32(bs[4*i]) | uint32(bs[4*i+1])<<8 | uint32(bs[4*i+2])<<16 | uint32(bs[4*i+3])<<24)
	}
	return out
}
