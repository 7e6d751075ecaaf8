package llm

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	yz "github.com/hybridgroup/yzma/pkg/llama"
	"github.com/hybridgroup/yzma/pkg/mtmd"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/media"
)

// The building blocks of vision on the current engine, checked against llama.cpp's own multimodal tool built from
// the same source: libmtmd (scripts/build-current-backend.sh mtmd) beside the pinned libllama, yzma's mtmd
// binding, a synthetic projector (synth.WriteProjector) on the test model, and an image decoded by media's
// sandboxed decoder. The same image and prompt must give the same greedy tokens here as through
// llama-mtmd-cli (PARLEY_MTMD_CLI; built by `cmake --build BUILD --target llama-mtmd-cli` in a tree configured with
// LLAMA_BUILD_COMMON and LLAMA_BUILD_TOOLS), and two images must give two replies (the image reaches the model).

// mtmdPrompt is the prompt llama-mtmd-cli makes of -p "Once upon a time" with --chat-template chatml: the media
// marker before the text, in a user turn.
const mtmdPrompt = "<|im_start|>user\n<__media__>Once upon a time<|im_end|>\n<|im_start|>assistant\n"

const mtmdTokens = 24

func TestMtmdMatchesLlamaMtmdCLI(t *testing.T) {
	cli := os.Getenv("PARLEY_MTMD_CLI")
	if cli == "" {
		t.Skip("PARLEY_MTMD_CLI (llama.cpp's llama-mtmd-cli from the pinned source) is not set")
	}
	dir := DefaultCurrentLibDir()
	if !fileExists(filepath.Join(dir, "libmtmd.so")) {
		t.Skipf("no libmtmd.so in %s (scripts/build-current-backend.sh mtmd)", dir)
	}
	if err := loadCurrent(dir); err != nil {
		t.Fatal(err)
	}
	if err := mtmd.Load(dir); err != nil {
		t.Fatalf("load libmtmd: %v", err)
	}
	mtmd.LogSet(yz.LogSilent())
	tmp := t.TempDir()
	model := testmodel.Path(t)
	proj := filepath.Join(tmp, "mmproj.gguf")
	if err := synth.WriteProjector(context.Background(), proj, synth.DefaultProjector()); err != nil {
		t.Fatal(err)
	}
	dec := media.NewDecoder()
	defer dec.Close()
	replies := map[string]bool{}
	for seed := range 2 {
		img, _, d := mtmdTestCase(t, dec, seed)
		want := mtmdCLIReply(t, cli, model, proj, img)
		got := strings.TrimSpace(mtmdGreedy(t, model, proj, d))
		t.Logf("image %d: %q", seed, got)
		if got != want {
			t.Errorf("image %d: Parley's libmtmd gave %q, llama-mtmd-cli %q", seed, got, want)
		}
		replies[got] = true
	}
	if len(replies) != 2 {
		t.Errorf("two images gave the same reply: the image does not reach the model")
	}
}

// mtmdTestCase writes seed's test image (mtmdTestImage) to a file of its own, for llama-mtmd-cli, and checks and
// decodes it as Parley does, for Parley.
func mtmdTestCase(t *testing.T, dec *media.Decoder, seed int) (path string, im *media.Image, d *media.Decoded) {
	t.Helper()
	data := mtmdTestImage(t, seed)
	path = filepath.Join(t.TempDir(), "image.png")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	im, err := media.Limits{}.Check(data)
	if err != nil {
		t.Fatal(err)
	}
	if d, err = dec.Decode(context.Background(), im); err != nil {
		t.Fatal(err)
	}
	return path, im, d
}

// mtmdTestImage is a 48x40 PNG whose pattern depends on seed (not square: the projector's preprocessing pads it).
func mtmdTestImage(t *testing.T, seed int) []byte {
	img := image.NewNRGBA(image.Rect(0, 0, 48, 40))
	for y := range 40 {
		for x := range 48 {
			img.Set(x, y, color.NRGBA{uint8(x*5 + seed*40), uint8(y*6 + seed*13), uint8((x ^ y) * 7), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// mtmdGreedy loads the model and the projector, evaluates mtmdPrompt with the image where the marker is (as
// llama-mtmd-cli does: text parts without special tokens, BOS once at the start, positions as libmtmd's helper
// places them, M-RoPE ones included), and decodes mtmdTokens greedily.
func mtmdGreedy(t *testing.T, modelPath, proj string, d *media.Decoded) string {
	t.Helper()
	m, err := yz.ModelLoadFromFile(modelPath, yz.ModelDefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	defer yz.ModelFree(m)
	cp := yz.ContextDefaultParams()
	cp.NCtx, cp.NBatch, cp.NUbatch, cp.NThreads, cp.NThreadsBatch = 512, 512, 512, 1, 1
	lctx, err := yz.InitFromModel(m, cp)
	if err != nil {
		t.Fatal(err)
	}
	defer yz.Free(lctx)
	mp := mtmd.ContextParamsDefault()
	mp.UseGPU, mp.Threads, mp.Warmup = false, 1, false
	mctx, err := mtmd.InitFromFile(proj, m, mp)
	if err != nil {
		t.Fatal(err)
	}
	defer mtmd.Free(mctx)
	if !mtmd.SupportVision(mctx) {
		t.Fatal("the projector takes no images")
	}
	bm := mtmd.BitmapInit(uint32(d.Width), uint32(d.Height), uintptr(unsafe.Pointer(&d.RGB[0])))
	defer mtmd.BitmapFree(bm)
	segs := strings.Split(mtmdPrompt, mtmd.DefaultMarker())
	var parts []*mtmd.InputPart
	for i, s := range segs {
		parts = append(parts, mtmd.NewInputTextPart(mtmd.NewInputText(s, false, true)))
		if i < len(segs)-1 {
			parts = append(parts, mtmd.NewInputBitmapPart(bm))
		}
	}
	chunks := mtmd.InputChunksInit()
	defer mtmd.InputChunksFree(chunks)
	if r := mtmd.TokenizeFromParts(mctx, chunks, parts, true); r != 0 {
		t.Fatalf("mtmd_tokenize: %d", r)
	}
	var past yz.Pos
	if r := mtmd.HelperEvalChunks(mctx, lctx, chunks, 0, 0, 512, true, &past); r != 0 {
		t.Fatalf("mtmd_helper_eval_chunks: %d", r)
	}
	vocab := yz.ModelGetVocab(m)
	smpl := yz.SamplerChainInit(yz.SamplerChainDefaultParams())
	defer yz.SamplerFree(smpl)
	yz.SamplerChainAdd(smpl, yz.SamplerInitGreedy())
	var out strings.Builder
	for range mtmdTokens {
		tok := yz.SamplerSample(smpl, lctx, -1)
		if yz.VocabIsEOG(vocab, tok) {
			break
		}
		buf := make([]byte, 64)
		n := yz.TokenToPiece(vocab, tok, buf, 0, true)
		out.Write(buf[:n])
		if _, err := yz.Decode(lctx, yz.BatchGetOne([]yz.Token{tok})); err != nil {
			t.Fatal(err)
		}
	}
	return out.String()
}

// mtmdCLIReply is llama-mtmd-cli's greedy reply to mtmdPrompt with the image file img. The tool prints through
// llama.cpp's asynchronous log, which an exit can cut short: a whole reply ends in a newline, and a cut one is run
// again.
func mtmdCLIReply(t *testing.T, cli, model, proj, img string) string {
	t.Helper()
	var out []byte
	for try := 0; try < 5 && !bytes.HasSuffix(out, []byte("\n")); try++ {
		cmd := exec.Command(cli, "-m", model, "--mmproj", proj, "--image", img, "-p", "Once upon a time",
			"--chat-template", "chatml", "-n", strconv.Itoa(mtmdTokens), "--temp", "0", "--top-k", "1", "-t", "1", "--no-warmup")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			t.Fatalf("llama-mtmd-cli: %v\n%s", err, stderr.String())
		}
	}
	return strings.TrimSpace(string(out))
}

// The engine takes an image in a prompt (parley.ImageToken, GenerateRequest.Images): the same greedy tokens as
// llama-mtmd-cli; a second turn that repeats the conversation with its image evaluates only its new tokens (the
// image is not encoded again); another user's request with the same image encodes its own.
func TestEngineImageMatchesLlamaMtmdCLI(t *testing.T) {
	cli := os.Getenv("PARLEY_MTMD_CLI")
	if cli == "" {
		t.Skip("PARLEY_MTMD_CLI (llama.cpp's llama-mtmd-cli from the pinned source) is not set")
	}
	dir := DefaultCurrentLibDir()
	if !fileExists(filepath.Join(dir, "libmtmd.so")) {
		if os.Getenv("PARLEY_REQUIRE_VISION") != "" {
			t.Fatalf("no libmtmd.so in %s (make setup-vision; the suite requires it)", dir)
		}
		t.Skipf("no libmtmd.so in %s (scripts/build-current-backend.sh mtmd)", dir)
	}
	tmp := t.TempDir()
	model := testmodel.Path(t)
	proj := filepath.Join(tmp, "mmproj.gguf")
	if err := synth.WriteProjector(context.Background(), proj, synth.DefaultProjector()); err != nil {
		t.Fatal(err)
	}
	data := mtmdTestImage(t, 1)
	img := filepath.Join(tmp, "image.png")
	if err := os.WriteFile(img, data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := mtmdCLIReply(t, cli, model, proj, img)

	e, err := Open(Config{Path: model, Projector: proj, Engine: EngineCurrent, LibDir: dir, Parallel: 1, Threads: 1, ContextLength: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	dec := media.NewDecoder()
	defer dec.Close()
	im, err := media.Limits{}.Check(data)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dec.Decode(context.Background(), im)
	if err != nil {
		t.Fatal(err)
	}
	image := func(user string) parley.Image {
		return parley.Image{Key: media.CacheKey(user, im.Hash), Width: d.Width, Height: d.Height, RGB: d.RGB}
	}
	// As llama-mtmd-cli tokenizes: each text part on its own, BOS once at the start.
	if mtmd.DefaultMarker() != parley.ImageMarker {
		t.Fatalf("libmtmd's marker is %q, parley.ImageMarker %q", mtmd.DefaultMarker(), parley.ImageMarker)
	}
	prompt, err := e.TokenizeImages(mtmdPrompt)
	if err != nil {
		t.Fatal(err)
	}
	head, err := e.be.Tokenize(strings.Split(mtmdPrompt, parley.ImageMarker)[0], true, true)
	if err != nil {
		t.Fatal(err)
	}
	p := parley.DefaultParams()
	p.Temperature, p.RepeatPenalty, p.MaxTokens, p.Seed = 0, 1, mtmdTokens, 1
	run := func(key, user string, toks []int) (string, []int, parley.Event) {
		t.Helper()
		ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: key, Tokens: toks, Images: []parley.Image{image(user)}, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		var ids []int
		var final parley.Event
		for ev := range ch {
			if ev.Done {
				final = ev
				continue
			}
			text.WriteString(ev.Token.Text)
			ids = append(ids, ev.Token.ID)
		}
		if final.Err != nil {
			t.Fatal(final.Err)
		}
		return text.String(), ids, final
	}
	got, ids, first := run("alice-1", "alice", prompt)
	if strings.TrimSpace(got) != want {
		t.Errorf("the engine replied %q, llama-mtmd-cli %q", strings.TrimSpace(got), want)
	}
	if n := e.imagesEvaluated.Load(); n != 1 {
		t.Errorf("%d images evaluated, want 1", n)
	}
	// The next turn: the conversation so far, its image included, and more text.
	more, err := e.be.Tokenize(" The end.", false, true)
	if err != nil {
		t.Fatal(err)
	}
	next := append(append(append([]int{}, prompt...), ids...), more...)
	_, _, second := run("alice-1", "alice", next)
	expanded := first.Usage.PromptTokens
	if second.Usage.CachedPromptTokens < expanded || e.imagesEvaluated.Load() != 1 {
		t.Errorf("second turn: %d of %d prompt positions cached (the first turn's were %d), %d images evaluated; want the image reused",
			second.Usage.CachedPromptTokens, second.Usage.PromptTokens, expanded, e.imagesEvaluated.Load())
	}
	t.Logf("first turn: %d prompt positions (16 of them the image), time to first token %v; second: %d, %d cached, %v",
		expanded, first.Timings.TimeToFirstToken, second.Usage.PromptTokens, second.Usage.CachedPromptTokens, second.Timings.TimeToFirstToken)
	if st := e.Stats(); st.ImagesReused != 1 || st.ImagesEncoded != 1 || st.ImageEncodeNanos <= 0 {
		t.Errorf("after the second turn: %d images reused, %d encoded in %dns; want 1 and 1", st.ImagesReused, st.ImagesEncoded, st.ImageEncodeNanos)
	}
	// Another user, the same image, the same slot (one): its own evaluation.
	run("bob-1", "bob", prompt)
	if n := e.imagesEvaluated.Load(); n != 2 {
		t.Errorf("%d images evaluated after another user's turn, want 2", n)
	}
	if st := e.Stats(); st.ImagesReused != 1 || st.ImagesEncoded != 2 {
		t.Errorf("after another user's turn: %d images reused, %d encoded; want 1 and 2", st.ImagesReused, st.ImagesEncoded)
	}
	// Refusals.
	if _, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: prompt, Params: p}); err == nil {
		t.Error("an image place without an image was accepted")
	}
	if _, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: append(append([]int{}, head...), parley.ImageToken),
		Images: []parley.Image{image("alice")}, Params: p}); err == nil {
		t.Error("a prompt ending in an image was accepted")
	}
	bad := image("alice")
	bad.RGB = bad.RGB[:10]
	if _, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: prompt, Images: []parley.Image{bad}, Params: p}); err == nil {
		t.Error("an image whose pixels do not fill it was accepted")
	}
}

// Through the KV swap: a conversation with an image, saved at shutdown, is warm after a restart. SavedTokens says
// nothing of a state with an image (its positions are no tokens), so the caller renders the conversation, and the
// engine restores the state by its common prefix: the image is not encoded again.
func TestEngineImageSurvivesRestart(t *testing.T) {
	dir := DefaultCurrentLibDir()
	if !fileExists(filepath.Join(dir, "libmtmd.so")) {
		t.Skipf("no libmtmd.so in %s (scripts/build-current-backend.sh mtmd)", dir)
	}
	tmp := t.TempDir()
	model := testmodel.Path(t)
	proj := filepath.Join(tmp, "mmproj.gguf")
	if err := synth.WriteProjector(context.Background(), proj, synth.DefaultProjector()); err != nil {
		t.Fatal(err)
	}
	rgb := make([]byte, 40*30*3)
	for i := range rgb {
		rgb[i] = byte(i * 7)
	}
	img := parley.Image{Key: media.CacheKey("alice", [32]byte{1}), Width: 40, Height: 30, RGB: rgb}
	cfg := Config{Path: model, Projector: proj, Engine: EngineCurrent, LibDir: dir, Parallel: 1, Threads: 1, ContextLength: 512,
		KVCache: KVCacheConfig{RAMBytes: 64 << 20, DiskBytes: 64 << 20, Dir: filepath.Join(tmp, "kv")}}
	p := parley.DefaultParams()
	p.Temperature, p.MaxTokens = 0, 8
	turn := func(e *Engine, toks []int) ([]int, parley.Event) {
		t.Helper()
		return generateTurn(t, e, "c1", toks, []parley.Image{img}, p)
	}
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prompt, tail := lookPrompt(t, e)
	ids, first := turn(e, prompt)
	if err := e.Close(); err != nil { // saves the slot's state
		t.Fatal(err)
	}

	e, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.SavedTokens(parley.ScopedKey("", "c1")); got != nil {
		t.Errorf("SavedTokens of a state with an image: %d tokens, want none", len(got))
	}
	next := append(append(append([]int{}, prompt...), ids...), tail...)
	_, second := turn(e, next)
	if second.Usage.CachedPromptTokens < first.Usage.PromptTokens || e.imagesEvaluated.Load() != 0 {
		t.Errorf("after a restart: %d of %d positions cached (the first turn's prompt was %d), %d images evaluated; want the image restored",
			second.Usage.CachedPromptTokens, second.Usage.PromptTokens, first.Usage.PromptTokens, e.imagesEvaluated.Load())
	}
	if st := e.Stats(); st.ImagesReused != 1 || st.ImagesEncoded != 0 {
		t.Errorf("after a restart: %d images reused, %d encoded; want the restored one counted as reused", st.ImagesReused, st.ImagesEncoded)
	}
}

// visionEngine opens the test model with a synthetic projector on the current engine, with parallel slots, and
// returns it with an image of user's.
func visionEngine(t *testing.T, parallel int) (*Engine, func(user string) parley.Image) {
	t.Helper()
	return visionEngineDraft(t, parallel, DraftOff)
}

// visionEngineDraft is visionEngine with speculative decoding in draft mode.
func visionEngineDraft(t *testing.T, parallel int, draft string) (*Engine, func(user string) parley.Image) {
	t.Helper()
	dir := DefaultCurrentLibDir()
	if !fileExists(filepath.Join(dir, "libmtmd.so")) {
		if os.Getenv("PARLEY_REQUIRE_VISION") != "" {
			t.Fatalf("no libmtmd.so in %s (make setup-vision; the suite requires it)", dir)
		}
		t.Skipf("no libmtmd.so in %s (scripts/build-current-backend.sh mtmd)", dir)
	}
	proj := filepath.Join(t.TempDir(), "mmproj.gguf")
	if err := synth.WriteProjector(context.Background(), proj, synth.DefaultProjector()); err != nil {
		t.Fatal(err)
	}
	e, err := Open(Config{Path: testmodel.Path(t), Projector: proj, Engine: EngineCurrent, LibDir: dir,
		Parallel: parallel, Threads: 1, ContextLength: 512, Draft: draft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	rgb := make([]byte, 40*30*3)
	for i := range rgb {
		rgb[i] = byte(i * 7)
	}
	return e, func(user string) parley.Image {
		return parley.Image{Key: media.CacheKey(user, [32]byte{1}), Width: 40, Height: 30, RGB: rgb}
	}
}

// drain reads a reply to its end (a hang guard of minutes: the test counts events, not time) and returns its text
// and final event.
func drain(t *testing.T, ch <-chan parley.Event, what string) (string, parley.Event) {
	t.Helper()
	var text strings.Builder
	guard := time.After(2 * time.Minute)
	for {
		select {
		case ev := <-ch:
			if ev.Done {
				return text.String(), ev
			}
			text.WriteString(ev.Token.Text)
		case <-guard:
			t.Fatalf("%s: no end in minutes (the loop is stalled)", what)
		}
	}
}

// An image is encoded off the decode loop: while its encode is held, another request's whole reply streams; the
// image's reply, once the encode goes on, is the one the engine gives the image unheld; a request cancelled while
// its image is with the encoder ends at once, and its image is freed when the encode is done.
func TestEngineImageEncodeOffTheLoop(t *testing.T) {
	e, image := visionEngine(t, 2)
	var holding atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	e.enc.hold = func() {
		if holding.Load() {
			entered <- struct{}{}
			<-release
		}
	}
	t.Cleanup(func() { // before the engine's Close: a failed test leaves no encode held
		holding.Store(false)
		close(release)
	})
	prompt, _ := lookPrompt(t, e)
	text, err := e.be.Tokenize("Once upon a time", true, true)
	if err != nil {
		t.Fatal(err)
	}
	p := parley.DefaultParams()
	p.Temperature, p.MaxTokens = 0, 16
	gen := func(ctx context.Context, toks []int, images []parley.Image, p parley.Params) <-chan parley.Event {
		t.Helper()
		ch, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Images: images, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	want, _ := drain(t, gen(context.Background(), prompt, []parley.Image{image("alice")}, p), "the image's reply")

	// Another user's image (its own encode), held in the encoder.
	holding.Store(true)
	imageReply := gen(context.Background(), prompt, []parley.Image{image("bob")}, p)
	<-entered
	const n = 32
	pt := p
	pt.MaxTokens = n
	got, final := drain(t, gen(context.Background(), text, nil, pt), "a text reply beside an encode")
	if final.Err != nil || final.Usage.CompletionTokens != n || len(imageReply) != 0 {
		t.Fatalf("while an image was encoded: a text reply of %d tokens (%q, %v), %d image events; want %d tokens and none",
			final.Usage.CompletionTokens, got, final.Err, len(imageReply), n)
	}
	release <- struct{}{}
	if got, final := drain(t, imageReply, "the image's reply after its encode"); got != want || final.Err != nil {
		t.Errorf("the image's reply after a held encode: %q (%v), unheld %q", got, final.Err, want)
	}

	// Cancelled while its image is with the encoder, with nothing else active: the cancellation wakes the loop.
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := gen(ctx, prompt, []parley.Image{image("carol")}, p)
	<-entered
	cancel()
	if _, final := drain(t, cancelled, "a cancelled image request"); final.Finish != parley.FinishCancelled {
		t.Errorf("cancelled while encoding: finish %v (%v)", final.Finish, final.Err)
	}
	release <- struct{}{}
	holding.Store(false)
	// The encoder is idle again and the next image goes through it.
	if got, _ := drain(t, gen(context.Background(), prompt, []parley.Image{image("dave")}, p), "an image after a cancelled encode"); got != want {
		t.Errorf("after a cancelled encode: %q, want %q", got, want)
	}
	if n := e.imagesEncoded.Load(); n != 4 {
		t.Errorf("%d images encoded, want 4 (alice, bob, carol's cancelled one, dave)", n)
	}
}

// TestEngineImageDrafts: a conversation whose second turn repeats its
// first (the image's question, its reply, then the question again) drafts
// from its history (ngram) up to an image's positions, never into them:
// the reply is the one without drafts and the engine goes on serving.
func TestEngineImageDrafts(t *testing.T) {
	off, image := visionEngine(t, 1)
	ngram, _ := visionEngineDraft(t, 1, DraftNgram)
	prompt, _ := lookPrompt(t, off)
	im := image("alice")
	p := parley.DefaultParams()
	p.Temperature, p.MaxTokens = 0, 8
	gen := func(e *Engine, toks []int, images []parley.Image, p parley.Params) (string, parley.Event) {
		t.Helper()
		ch, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: toks, Images: images, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		return drain(t, ch, "a reply")
	}
	first, _ := gen(off, prompt, []parley.Image{im}, p)
	reply, err := off.be.Tokenize(first, false, false)
	if err != nil {
		t.Fatal(err)
	}
	// "Look:" IMG " what is it?" REPLY "Look:" IMG " what is it?": the
	// second reply repeats the first, whose continuation in the history is
	// "Look:" and the image.
	again := append(append(append([]int{}, prompt...), reply...), prompt[1:]...)
	p.MaxTokens = 24
	want, plain := gen(off, again, []parley.Image{im, im}, p)
	got, final := gen(ngram, again, []parley.Image{im, im}, p)
	if plain.Err != nil || final.Err != nil || got != want {
		t.Fatalf("with drafts %q (%v), without %q (%v)", got, final.Err, want, plain.Err)
	}
	if ngram.drafted.Load() == 0 {
		t.Errorf("no draft tokens: the repeated turn should draft")
	}
	// The engine still serves.
	if got2, final := gen(ngram, again, []parley.Image{im, im}, p); got2 != want || final.Err != nil {
		t.Errorf("the next reply: %q (%v), want %q", got2, final.Err, want)
	}
}

// lookPrompt is the tests' image prompt: "Look:", the image, " what is it?";
// and the tokens of its text after the image.
func lookPrompt(t *testing.T, e *Engine) (prompt, tail []int) {
	t.Helper()
	head, err := e.be.Tokenize("Look:", true, true)
	if err != nil {
		t.Fatal(err)
	}
	tail, err = e.be.Tokenize(" what is it?", false, true)
	if err != nil {
		t.Fatal(err)
	}
	return append(append(append([]int{}, head...), parley.ImageToken), tail...), tail
}
