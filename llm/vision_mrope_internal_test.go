package llm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/media"
)

// Images with M-RoPE positions (Qwen2-VL's projector) on the current engine, with a synthetic Qwen2-VL pair: an
// image of nx by ny embeddings takes max(nx, ny) positions, so after it a slot's position is less than its token
// count. Each test compares greedy tokens with a fresh engine that evaluates the whole conversation at once, so
// that a position off by any amount (the model's attention rotates by it) shows as other tokens.

// qwenPair writes the synthetic Qwen2-VL text model and projector (once per test) and returns their paths and the
// folder of libmtmd.
func qwenPair(t *testing.T) (model, proj, lib string) {
	t.Helper()
	lib = DefaultCurrentLibDir()
	if !fileExists(filepath.Join(lib, "libmtmd.so")) {
		if os.Getenv("PARLEY_REQUIRE_VISION") != "" {
			t.Fatalf("no libmtmd.so in %s (make setup-vision; the suite requires it)", lib)
		}
		t.Skipf("no libmtmd.so in %s (scripts/build-current-backend.sh mtmd)", lib)
	}
	dir := t.TempDir()
	model, proj = filepath.Join(dir, "qwen2vl.gguf"), filepath.Join(dir, "mmproj-qwen2vl.gguf")
	if _, err := synth.Write(context.Background(), model, synth.QwenVLSpec(testmodel.Path(t))); err != nil {
		t.Fatal(err)
	}
	if err := synth.WriteProjector(context.Background(), proj, synth.QwenVLProjector()); err != nil {
		t.Fatal(err)
	}
	return model, proj, lib
}

// openQwen opens the pair on the current engine; cfg's other fields are kept.
func openQwen(t *testing.T, model, proj, lib string, cfg Config) *Engine {
	t.Helper()
	cfg.Path, cfg.Projector, cfg.Engine, cfg.LibDir, cfg.Threads = model, proj, EngineCurrent, lib, 1
	if cfg.Parallel == 0 {
		cfg.Parallel = 1
	}
	if cfg.ContextLength == 0 {
		cfg.ContextLength = 512
	}
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if e.vision == nil || !e.vision.mrope {
		t.Fatal("the Qwen2-VL projector does not place M-RoPE positions")
	}
	return e
}

// qwenImage is a 48x40 image of user's whose pattern depends on seed: libmtmd resizes it to a grid of 3x3
// embeddings at 3 positions or thereabouts.
func qwenImage(user string, seed byte) parley.Image {
	rgb := make([]byte, 48*40*3)
	for i := range rgb {
		rgb[i] = byte(i*7) ^ seed*37
	}
	return parley.Image{Key: media.CacheKey(user, [32]byte{seed}), Width: 48, Height: 40, RGB: rgb}
}

// greedyTurn generates a greedy reply of n tokens to toks with images, under key, and returns its token ids and
// final event.
func greedyTurn(t *testing.T, e *Engine, key string, toks []int, images []parley.Image, n int) ([]int, parley.Event) {
	t.Helper()
	p := parley.DefaultParams()
	p.Temperature, p.RepeatPenalty, p.MaxTokens, p.Seed = 0, 1, n, 1
	return generateTurn(t, e, key, toks, images, p)
}

// generateTurn generates a reply to toks with images under key and p, and returns its token ids and final event
// (an error ends the test).
func generateTurn(t *testing.T, e *Engine, key string, toks []int, images []parley.Image, p parley.Params) ([]int, parley.Event) {
	t.Helper()
	ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: key, Tokens: toks, Images: images, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	var final parley.Event
	for ev := range ch {
		if ev.Done {
			final = ev
			continue
		}
		ids = append(ids, ev.Token.ID)
	}
	if final.Err != nil {
		t.Fatal(final.Err)
	}
	return ids, final
}

// The image takes fewer positions than embeddings; the reply is the one libmtmd's own helper gives (it places the
// positions as llama-mtmd-cli does) and depends on the image; a second turn that repeats the conversation with its
// image evaluates only its new tokens and gives the tokens a fresh engine gives the whole conversation at once.
func TestEngineMRopeImageTurns(t *testing.T) {
	model, proj, lib := qwenPair(t)
	e := openQwen(t, model, proj, lib, Config{})
	img := qwenImage("alice", 1)
	run, err := e.vision.tokenize(img)
	if err != nil {
		t.Fatal(err)
	}
	n, nPos := run.n, run.nPos
	run.free()
	if nPos >= n {
		t.Fatalf("an image of %d embeddings at %d positions: want fewer positions (M-RoPE)", n, nPos)
	}
	prompt, err := e.TokenizeImages(mtmdPrompt)
	if err != nil {
		t.Fatal(err)
	}
	ids, first := greedyTurn(t, e, "c1", prompt, []parley.Image{img}, mtmdTokens)
	var text strings.Builder
	for _, id := range ids {
		text.WriteString(e.TokenText(id))
	}
	if want := mtmdGreedy(t, model, proj, &media.Decoded{Width: img.Width, Height: img.Height, RGB: img.RGB}); text.String() != want {
		t.Errorf("the engine replied %q, libmtmd's helper %q", text.String(), want)
	}

	_, tail := lookPrompt(t, e)
	next := append(append(append([]int{}, prompt...), ids...), tail...)
	evalBefore, imagesBefore := e.promptEval.Load(), e.imagesEvaluated.Load()
	got, second := greedyTurn(t, e, "c1", next, []parley.Image{img}, mtmdTokens)
	evaluated := e.promptEval.Load() - evalBefore
	if second.Usage.CachedPromptTokens < first.Usage.PromptTokens || e.imagesEvaluated.Load() != imagesBefore ||
		evaluated != int64(second.Usage.PromptTokens-second.Usage.CachedPromptTokens) {
		t.Errorf("second turn: %d of %d entries cached (the first prompt's were %d), %d evaluated, %d images evaluated; want only the new ones",
			second.Usage.CachedPromptTokens, second.Usage.PromptTokens, first.Usage.PromptTokens, evaluated, e.imagesEvaluated.Load()-imagesBefore)
	}
	t.Logf("an image of %d embeddings at %d positions; second turn: %d prompt entries, %d cached, %d evaluated",
		n, nPos, second.Usage.PromptTokens, second.Usage.CachedPromptTokens, evaluated)

	fresh := openQwen(t, model, proj, lib, Config{})
	want, _ := greedyTurn(t, fresh, "", next, []parley.Image{img}, mtmdTokens)
	if !slices.Equal(got, want) {
		t.Errorf("second turn from the cache: %v; a fresh engine, the whole conversation at once: %v", got, want)
	}
	if other, _ := greedyTurn(t, fresh, "", prompt, []parley.Image{qwenImage("alice", 2)}, mtmdTokens); slices.Equal(ids, other) {
		t.Errorf("two images gave the same reply %v: the image does not reach the model", ids)
	}
}

// A slot that copies another's prefix with an image (copyPrefix) goes on at the image's positions: its reply is a
// fresh engine's.
func TestEngineMRopeImagePrefixCopy(t *testing.T) {
	model, proj, lib := qwenPair(t)
	e := openQwen(t, model, proj, lib, Config{Parallel: 2})
	img := qwenImage("alice", 1)
	prompt, tail := lookPrompt(t, e)
	ids, _ := greedyTurn(t, e, "a", prompt, []parley.Image{img}, 8)
	// The same opening and image, then other text: the first slot holds a reply this prompt lacks, so the
	// request takes the other slot and copies the shared prefix.
	other := append(append(append([]int{}, prompt...), tail...), tail...)
	if slices.Equal(other[len(prompt):len(prompt)+len(ids)], ids) {
		t.Fatal("the other prompt repeats the reply: no copy")
	}
	copiesBefore := e.prefixCopies.Load()
	got, final := greedyTurn(t, e, "b", other, []parley.Image{img}, 8)
	if e.prefixCopies.Load() != copiesBefore+1 || final.Usage.CachedPromptTokens < len(prompt) || e.imagesEvaluated.Load() != 1 {
		t.Errorf("%d prefix copies, %d of %d entries cached, %d images evaluated; want the image's prefix copied",
			e.prefixCopies.Load()-copiesBefore, final.Usage.CachedPromptTokens, final.Usage.PromptTokens, e.imagesEvaluated.Load())
	}
	fresh := openQwen(t, model, proj, lib, Config{})
	want, _ := greedyTurn(t, fresh, "", other, []parley.Image{img}, 8)
	if !slices.Equal(got, want) {
		t.Errorf("after a prefix copy: %v; a fresh engine: %v", got, want)
	}
}

// Through the KV swap: the state of a conversation with an M-RoPE image, saved at shutdown and restored after a
// restart, knows its positions from its tokens: the next turn evaluates only its new tokens and gives a fresh
// engine's reply.
func TestEngineMRopeImageSurvivesRestart(t *testing.T) {
	model, proj, lib := qwenPair(t)
	cfg := Config{KVCache: KVCacheConfig{RAMBytes: 64 << 20, DiskBytes: 64 << 20, Dir: filepath.Join(t.TempDir(), "kv")}}
	img := qwenImage("alice", 1)
	e := openQwen(t, model, proj, lib, cfg)
	prompt, tail := lookPrompt(t, e)
	ids, first := greedyTurn(t, e, "c1", prompt, []parley.Image{img}, 8)
	if err := e.Close(); err != nil { // saves the slot's state
		t.Fatal(err)
	}

	e = openQwen(t, model, proj, lib, cfg)
	next := append(append(append([]int{}, prompt...), ids...), tail...)
	got, second := greedyTurn(t, e, "c1", next, []parley.Image{img}, 8)
	if second.Usage.CachedPromptTokens < first.Usage.PromptTokens || e.imagesEvaluated.Load() != 0 {
		t.Errorf("after a restart: %d of %d entries cached (the first prompt's were %d), %d images evaluated; want the image restored",
			second.Usage.CachedPromptTokens, second.Usage.PromptTokens, first.Usage.PromptTokens, e.imagesEvaluated.Load())
	}
	fresh := openQwen(t, model, proj, lib, Config{})
	want, _ := greedyTurn(t, fresh, "", next, []parley.Image{img}, 8)
	if !slices.Equal(got, want) {
		t.Errorf("after a restore: %v; a fresh engine: %v", got, want)
	}
}

// N-gram drafts after an M-RoPE image are decoded at the positions after it: a turn that repeats its history
// drafts, and its reply is the one without drafts.
func TestEngineMRopeImageDrafts(t *testing.T) {
	model, proj, lib := qwenPair(t)
	off := openQwen(t, model, proj, lib, Config{})
	ngram := openQwen(t, model, proj, lib, Config{Draft: DraftNgram})
	img := qwenImage("alice", 1)
	prompt, _ := lookPrompt(t, off)
	ids, _ := greedyTurn(t, off, "", prompt, []parley.Image{img}, 12)
	// "Look:" IMG " what is it?" REPLY " what is it?" REPLY: the reply after the repeated question is in the
	// history, after the image.
	_, tail := lookPrompt(t, off)
	again := append(append(append(append([]int{}, prompt...), ids...), tail...), ids[:4]...)
	want, _ := greedyTurn(t, off, "", again, []parley.Image{img}, 16)
	got, _ := greedyTurn(t, ngram, "", again, []parley.Image{img}, 16)
	if !slices.Equal(got, want) {
		t.Errorf("with drafts %v, without %v", got, want)
	}
	if ngram.drafted.Load() == 0 {
		t.Error("no draft tokens: the repeated reply should draft from the history after the image")
	}
}

// The Qwen2-VL pair through the engine gives the same greedy tokens as llama-mtmd-cli, built from the same
// source, for the same image and prompt (PARLEY_MTMD_CLI).
func TestEngineMRopeMatchesLlamaMtmdCLI(t *testing.T) {
	cli := os.Getenv("PARLEY_MTMD_CLI")
	if cli == "" {
		t.Skip("PARLEY_MTMD_CLI (llama.cpp's llama-mtmd-cli from the pinned source) is not set")
	}
	model, proj, lib := qwenPair(t)
	e := openQwen(t, model, proj, lib, Config{})
	prompt, err := e.TokenizeImages(mtmdPrompt)
	if err != nil {
		t.Fatal(err)
	}
	dec := media.NewDecoder()
	defer dec.Close()
	replies := map[string]bool{}
	for seed := range 2 {
		path, im, d := mtmdTestCase(t, dec, seed)
		want := mtmdCLIReply(t, cli, model, proj, path)
		img := parley.Image{Key: media.CacheKey("alice", im.Hash), Width: d.Width, Height: d.Height, RGB: d.RGB}
		ids, _ := greedyTurn(t, e, "", prompt, []parley.Image{img}, mtmdTokens)
		var text strings.Builder
		for _, id := range ids {
			text.WriteString(e.TokenText(id))
		}
		got := strings.TrimSpace(text.String())
		t.Logf("image %d: %q", seed, got)
		if got != want {
			t.Errorf("image %d: the engine replied %q, llama-mtmd-cli %q", seed, got, want)
		}
		replies[got] = true
	}
	if len(replies) != 2 {
		t.Error("two images gave the same reply: the image does not reach the model")
	}
}
