package router_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/router"
	"github.com/parley-chat/parley/web"
)

func TestMain(m *testing.M) {
	llm.SetNativeLog(os.Stderr, false)
	goleak.VerifyTestMain(m)
}

// newRouter serves stories260K twice, as "a" (the default) and "b", and a
// damaged file as "broken".
func newRouter(t *testing.T, mutate func(*router.Config)) *router.Router {
	t.Helper()
	broken := filepath.Join(t.TempDir(), "broken.gguf")
	if err := os.WriteFile(broken, []byte("GGUF not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := router.Config{
		Entries: []router.Entry{
			{Name: "a", Path: testmodel.Path(t)},
			{Name: "b", Path: testmodel.Path(t), Ctx: 128},
			{Name: "broken", Path: broken},
		},
		Default:   "a",
		Engine:    llm.Config{Engine: llm.EngineEmbedded, Threads: 1, Parallel: 1, ContextLength: 256},
		MaxTokens: 16,
		KeepAlive: -1,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := router.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

func states(r *router.Router) map[string]string {
	out := map[string]string{}
	for _, m := range r.View().Models() {
		out[m.Name] = m.State
	}
	return out
}

// TestRouterGivesEachRequestItsModel: a request loads and uses the model
// it names and no other; an unknown name and a damaged file are refused
// with their own codes; unloading frees the model until it is asked for.
func TestRouterGivesEachRequestItsModel(t *testing.T) {
	r := newRouter(t, nil)
	if got := states(r); got["a"] != "unloaded" || got["b"] != "unloaded" {
		t.Fatalf("before any request nothing is loaded: %v", got)
	}
	if r.Default() != "a" || strings.Join(r.Names(), ",") != "a,b,broken" {
		t.Fatalf("default %q, names %v", r.Default(), r.Names())
	}
	if r.Info().ContextLength == 0 && r.Info().TrainContext == 0 {
		t.Fatalf("the default model's header facts are known before it loads: %+v", r.Info())
	}

	ctx := context.Background()
	p := parley.DefaultParams()
	p.MaxTokens, p.Temperature = 4, 0
	rep, err := r.Reply(ctx, parley.ReplyRequest{Key: "k", Model: "b", Messages: []parley.Message{{Role: parley.RoleUser, Content: "Once upon a time"}}, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	for range rep.Events() {
	}
	<-rep.Done()
	if rep.Text() == "" {
		t.Fatal("the reply from b is empty")
	}
	if got := states(r); got["b"] != "loaded" || got["a"] != "unloaded" {
		t.Fatalf("only b serves: %v", got)
	}
	if st := r.Stats(); st.Slots != 1 || st.TokensGenerated == 0 {
		t.Fatalf("the loaded engine's counters: %+v", st)
	}

	_, err = r.Reply(context.Background(), parley.ReplyRequest{Key: "k", Model: "nope", Params: p})
	if parley.ErrorCode(err) != parley.ENotFound {
		t.Fatalf("an unknown model: want not_found, got %v", err)
	}
	_, err = r.Complete(context.Background(), parley.ReplyRequest{Key: "k", Model: "broken", Prompt: "x", Params: p})
	if parley.ErrorCode(err) != parley.EUnavailable || !strings.Contains(err.Error(), `model "broken" cannot be loaded`) {
		t.Fatalf("a damaged file: want unavailable, got %v", err)
	}
	if m := r.View().Models(); m[0].Name != "a" || !m[0].Default {
		t.Fatalf("the default is listed first: %+v", m[0])
	}

	tok, release, err := r.TokenizerFor(context.Background(), "a", false)
	release()
	if err != nil || tok != nil {
		t.Fatalf("without load, an unloaded model has no tokenizer: %v, %v", tok, err)
	}
	if ids, err := r.Tokenize("Once upon a time"); err != nil || len(ids) == 0 {
		t.Fatalf("Tokenize loads the default: %v, %v", ids, err)
	}
	if got := states(r); got["a"] != "loaded" {
		t.Fatalf("a after Tokenize: %v", got)
	}
	if err := r.View().Unload("b"); err != nil {
		t.Fatal(err)
	}
	if got := states(r); got["b"] != "unloaded" && got["b"] != "unloading" {
		t.Fatalf("b after Unload: %v", got)
	}
}

// TestRouterRefusesACapOverAModelsContext: a default reply cap that leaves
// a model no room for a prompt is an error naming the model.
func TestRouterRefusesACapOverAModelsContext(t *testing.T) {
	_, err := router.New(router.Config{
		Entries:   []router.Entry{{Name: "small", Path: testmodel.Path(t), Ctx: 64}},
		Engine:    llm.Config{Engine: llm.EngineEmbedded, ContextLength: 256},
		MaxTokens: 64,
	})
	if err == nil || !strings.Contains(err.Error(), `model "small": --max-tokens 64 must be below --ctx 64`) {
		t.Fatalf("want the cap refused, got %v", err)
	}
}

// TestStartLoadsWhatIsMarked: Start loads the entries marked load, and a
// model's Close detaches its engine from the stand-in.
func TestStartLoadsWhatIsMarked(t *testing.T) {
	r := newRouter(t, func(c *router.Config) { c.Entries[1].Load = true })
	r.Start(context.Background())
	if got := states(r); got["b"] != "loaded" || got["a"] != "unloaded" {
		t.Fatalf("after Start: %v", got)
	}
	var tk web.Tokenizer
	tk, release, err := r.TokenizerFor(context.Background(), "b", false)
	if err != nil || tk == nil {
		t.Fatalf("a loaded model's tokenizer without load: %v, %v", tk, err)
	}
	release()
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Slots != 0 {
		t.Fatalf("after Close the counters leave the sum: %+v", st)
	}
}

// TestEngineRefBeforeItsEngine: the stand-in answers unavailable until an
// engine is set.
func TestEngineRefBeforeItsEngine(t *testing.T) {
	var ref router.EngineRef
	if _, err := ref.Tokenize("x"); parley.ErrorCode(err) != parley.EUnavailable {
		t.Fatalf("Tokenize before load: %v", err)
	}
	if _, err := ref.Generate(context.Background(), parley.GenerateRequest{}); parley.ErrorCode(err) != parley.EUnavailable {
		t.Fatalf("Generate before load: %v", err)
	}
	if ref.Name() != "" || ref.TokenText(1) != "" || ref.SavedTokens("k") != nil || ref.Stats().Slots != 0 {
		t.Fatal("an empty stand-in has no facts")
	}
	e, err := llm.Open(llm.Config{Path: testmodel.Path(t), Engine: llm.EngineEmbedded, Threads: 1, Parallel: 1, ContextLength: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ref.Set(e)
	if ref.Name() != llm.EngineEmbedded || ref.Stats().Slots != 1 {
		t.Fatalf("with its engine: name %q, stats %+v", ref.Name(), ref.Stats())
	}
}
