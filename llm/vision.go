package llm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	yz "github.com/hybridgroup/yzma/pkg/llama"
	"github.com/hybridgroup/yzma/pkg/mtmd"

	"github.com/parley-chat/parley"
)

// Vision on the current engine: llama.cpp's libmtmd (scripts/build-current-backend.sh mtmd builds it from the
// pinned source, beside the pinned libllama) turns an image into a run of embeddings that are decoded into a
// sequence's KV cache at its position, as tokens are. In a slot's token list an image's run is held as pseudo
// token ids derived from the image's key (imageIDs), so that the longest-common-prefix reuse of the KV cache, the
// slot copies and the KV swap treat an image like the tokens around it: a later turn that repeats the image
// finds it evaluated already, and the key holds the user (media.CacheKey), so no other user's request ever matches
// it.
//
// Positions: a token, and an image's embedding under most projectors, takes one position of the sequence, so the
// KV position of a slot's token list's entry i is i. A projector with M-RoPE positions (Qwen2-VL, Qwen2.5-VL,
// Qwen3-VL) places an image's grid of nx by ny embeddings over max(nx, ny) positions (nPos): all its KV cells
// carry the image's first position, each embedding a height and width of its own beside it, and the text after
// the image goes on nPos positions later. The pseudo ids say which entries take a position (positions.go), so that
// a token list alone, wherever it is kept (a slot, a preempted sequence, a state of the KV swap), maps each of its
// entries to its KV position.

// vision is the projector's libmtmd context. mtmd's context is not safe for concurrent use: mu serializes Generate's
// tokenizing (which preprocesses an image) and the encoder's encoding (imageloop.go). The loop's decoding of an
// encoded image into the KV cache (decode) takes no lock: mtmd_helper_decode_image_chunk reads only what the context
// fixed when it was made (the projector type, the kind of positions, the text model's width), and the loop runs it
// only before Shutdown frees the context.
type vision struct {
	mu     sync.Mutex
	ctx    mtmd.Context
	closed bool // under mu: ctx is freed (a Generate racing Shutdown finds it so)
	nEmbd  int  // floats per embedding: the text model's input width, which libmtmd checks the projector's against
	mrope  bool // the projector places images with M-RoPE positions: fewer positions than embeddings
	decode func(ctx mtmd.Context, lc yz.Context, chunk mtmd.InputChunk, embd *float32, nPast yz.Pos, seq yz.SeqId, nBatch int32, newNPast *yz.Pos, callback, userData uintptr) int32
}

// imageRun is one image of a request, tokenized: its chunk (C memory, freed by free), how many embeddings it has
// (n: KV cells, and entries of a slot's token list), how many positions it advances the sequence by (nPos: n, or
// fewer with M-RoPE), and the text tokens the model wraps an image in (Gemma 3's <start_of_image> and
// <end_of_image>, Qwen-VL's vision start and end; none for LLaVA), which libmtmd puts around it. The fields after
// post are the loop's: the encoder's output and where the run is on its way through the encoder.
type imageRun struct {
	key       [32]byte
	chunk     mtmd.InputChunk
	n, nPos   int
	pre, post []int

	embd     []float32 // n embeddings of vision.nEmbd floats each, once encoded (nil: not yet)
	err      error     // the encode failed: the sequence ends with it
	encoding bool      // with the encoder now: only the encoder touches chunk until it comes back
	orphaned bool      // its sequence ended while it was with the encoder: the loop frees it when it comes back
}

var (
	mtmdOnce   sync.Once
	mtmdErr    error
	mtmdDecode func(ctx mtmd.Context, lc yz.Context, chunk mtmd.InputChunk, embd *float32, nPast yz.Pos, seq yz.SeqId, nBatch int32, newNPast *yz.Pos, callback, userData uintptr) int32
)

// loadMtmd loads libmtmd from dir, once per process, after the current engine's libraries.
func loadMtmd(dir string) error {
	mtmdOnce.Do(func() {
		path := filepath.Join(dir, "libmtmd.so")
		if !fileExists(path) {
			mtmdErr = fmt.Errorf("no libmtmd.so in %s (scripts/build-current-backend.sh mtmd builds it)", dir)
			return
		}
		if mtmdErr = mtmd.Load(dir); mtmdErr != nil {
			mtmdErr = fmt.Errorf("load libmtmd: %w", mtmdErr)
			return
		}
		mtmd.LogSet(yz.LogSilent())
		// yzma binds the helper that evaluates all of a prompt's chunks; the loop decodes one encoded image at a
		// time, on one sequence (its positions and batches, and the non-causal pass some models need), which
		// this helper does.
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			mtmdErr = fmt.Errorf("open libmtmd.so: %w", err)
			return
		}
		sym, err := purego.Dlsym(h, "mtmd_helper_decode_image_chunk")
		if err != nil {
			mtmdErr = fmt.Errorf("libmtmd.so has no mtmd_helper_decode_image_chunk: %w", err)
			return
		}
		purego.RegisterFunc(&mtmdDecode, sym)
	})
	return mtmdErr
}

// openVision loads the projector for the backend's model.
func openVision(be *current, cfg Config) (*vision, error) {
	if err := loadMtmd(cfg.LibDir); err != nil {
		return nil, err
	}
	p := mtmd.ContextParamsDefault()
	p.UseGPU = cfg.GPULayers != 0
	p.Threads = int32(max(1, cfg.Threads))
	p.Warmup = false
	ctx, err := mtmd.InitFromFile(cfg.Projector, be.model, p)
	if err != nil || ctx == 0 {
		return nil, fmt.Errorf("load the projector %s: libmtmd could not (a projector for another model, or not one it knows)", cfg.Projector)
	}
	v := &vision{ctx: ctx, nEmbd: int(yz.ModelNEmbdInp(be.model)), mrope: mtmd.DecodeUseMRope(ctx), decode: mtmdDecode}
	if !mtmd.SupportVision(ctx) {
		v.close()
		return nil, fmt.Errorf("the projector %s takes no images", cfg.Projector)
	}
	return v, nil
}

func (v *vision) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.closed {
		v.closed = true
		mtmd.Free(v.ctx)
	}
}

// tokenize preprocesses img and returns its run. Safe from any goroutine.
func (v *vision) tokenize(img parley.Image) (*imageRun, error) {
	if img.Width <= 0 || img.Height <= 0 || len(img.RGB) != img.Width*img.Height*3 {
		return nil, fmt.Errorf("an image of %dx%d pixels in %d bytes", img.Width, img.Height, len(img.RGB))
	}
	bm := mtmd.BitmapInit(uint32(img.Width), uint32(img.Height), uintptr(unsafe.Pointer(&img.RGB[0])))
	if bm == 0 {
		return nil, errors.New("libmtmd took no bitmap")
	}
	defer mtmd.BitmapFree(bm)
	chunks := mtmd.InputChunksInit()
	defer mtmd.InputChunksFree(chunks)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, errors.New("the model is shutting down")
	}
	if r := mtmd.Tokenize(v.ctx, chunks, mtmd.NewInputText(mtmd.DefaultMarker(), false, false), []mtmd.Bitmap{bm}); r != 0 {
		return nil, fmt.Errorf("libmtmd could not tokenize the image (%d)", r)
	}
	var run *imageRun
	var pre, post []int
	for i := range mtmd.InputChunksSize(chunks) {
		c := mtmd.InputChunksGet(chunks, i)
		switch mtmd.InputChunkGetType(c) {
		case mtmd.InputChunkTypeText:
			for _, t := range mtmd.InputChunkGetTokensText(c) {
				if run == nil {
					pre = append(pre, int(t))
				} else {
					post = append(post, int(t))
				}
			}
		case mtmd.InputChunkTypeImage:
			if run != nil {
				run.free()
				return nil, errors.New("libmtmd made two image chunks of one image")
			}
			n, nPos := int(mtmd.InputChunkGetNTokens(c)), int(mtmd.InputChunkGetNPos(c))
			if n <= 0 || nPos <= 0 || nPos > n || (nPos != n && !v.mrope) {
				return nil, fmt.Errorf("an image of %d embeddings at %d positions", n, nPos)
			}
			run = &imageRun{key: img.Key, chunk: mtmd.InputChunkCopy(c), n: n, nPos: nPos}
		default:
			if run != nil {
				run.free()
			}
			return nil, errors.New("libmtmd made a chunk that is neither text nor image")
		}
	}
	if run == nil {
		return nil, errors.New("libmtmd made no image chunk")
	}
	run.pre, run.post = pre, post
	return run, nil
}

// encode runs the projector over run's image and returns its embeddings. Called by the encoder, off the loop: it
// uses the projector's own backend, never the llama context.
func (v *vision) encode(run *imageRun) ([]float32, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, errors.New("the model is shutting down")
	}
	if err := mtmd.EncodeChunk(v.ctx, run.chunk); err != nil {
		return nil, fmt.Errorf("encode an image: %w", err)
	}
	out, err := mtmd.GetOutputEmbd(v.ctx, int32(run.n*v.nEmbd))
	if err != nil {
		return nil, fmt.Errorf("encode an image: %w", err)
	}
	return slices.Clone(out), nil // the context's buffer is the next encode's
}

// decodeImage decodes run's embeddings into seq's KV cache from position pos (the image's first; with M-RoPE
// libmtmd adds each embedding's height and width), in batches of nBatch. Called by the loop, with run encoded.
func (v *vision) decodeImage(lc yz.Context, run *imageRun, seq, pos, nBatch int) error {
	if len(run.embd) != run.n*v.nEmbd {
		return fmt.Errorf("an image of %d floats for %d embeddings", len(run.embd), run.n)
	}
	var next yz.Pos
	if r := v.decode(v.ctx, lc, run.chunk, &run.embd[0], yz.Pos(pos), yz.SeqId(seq), int32(nBatch), &next, 0, 0); r != 0 {
		return fmt.Errorf("decode an image (%d)", r)
	}
	if int(next) != pos+run.nPos {
		return fmt.Errorf("an image decoded to position %d, not %d", next, pos+run.nPos)
	}
	return nil
}

func (r *imageRun) free() {
	mtmd.InputChunkFree(r.chunk)
	r.embd = nil
}

// imageIDs are the pseudo token ids of an image's n entries in a slot's token list, nPos of which take a position
// (positions.go): negative, below parley.ImageToken, derived from the key (30 bits of it, since the KV swap's files
// hold ids as int32). The first nPos ids are in the range of ids that take a position, the rest in the range of
// those that do not, so that a token list says by itself which of its entries take one. Two different images of one user share a run
// with a chance of about one in 2^30; images of two users never meet (the key holds the user, and a slot of another
// scope is emptied before use).
func imageIDs(key [32]byte, n, nPos int) []int {
	h := binary.LittleEndian.Uint32(key[:4]) & (1<<30 - 1)
	ids := make([]int, n)
	for i := range ids {
		if i < nPos {
			ids[i] = -2 - int((h+uint32(i))%positionIDs)
		} else {
			ids[i] = heldIDs - int((h+uint32(i))%(positionIDs-1))
		}
	}
	return ids
}

// expandImages tokenizes req's images and returns its tokens with each parley.ImageToken replaced by its image's
// run of pseudo ids, and the runs by their first id. The prompt must not end in an image (the reply is sampled
// from a token's logits).
func (e *Engine) expandImages(req parley.GenerateRequest) ([]int, map[int]*imageRun, error) {
	if e.vision == nil {
		return nil, nil, parley.FieldErrorf("images", "this model takes no images (it was loaded without a projector)")
	}
	if req.Tokens[len(req.Tokens)-1] == parley.ImageToken {
		return nil, nil, parley.FieldErrorf("prompt", "must not end in an image")
	}
	runs := map[int]*imageRun{}
	out := make([]int, 0, len(req.Tokens))
	next := 0
	for _, t := range req.Tokens {
		if t != parley.ImageToken {
			out = append(out, t)
			continue
		}
		run, err := e.vision.tokenize(req.Images[next])
		if err != nil {
			freeRuns(runs)
			return nil, nil, parley.FieldErrorf(fmt.Sprintf("images[%d]", next), "%v", err)
		}
		next++
		ids := imageIDs(run.key, run.n, run.nPos)
		if prev, ok := runs[ids[0]]; ok { // the same image twice: one run serves both places
			run.free()
			run = prev
		}
		runs[ids[0]] = run
		out = append(out, run.pre...)
		out = append(out, ids...)
		out = append(out, run.post...)
	}
	if len(out) >= e.nCtx {
		freeRuns(runs)
		return nil, nil, parley.PromptTooLong(len(out), e.nCtx, "prompt is %d positions with its images; the context holds %d", len(out), e.nCtx)
	}
	return out, runs, nil
}

func freeRuns(runs map[int]*imageRun) {
	for _, r := range runs {
		r.free()
	}
}

// closeVision frees the projector's context; e.vision stays set (closed), for Generate calls racing the close.
func (e *Engine) closeVision() {
	if e.vision != nil {
		e.vision.close()
	}
}

// imageBoundary moves keep, a count of toks to keep in a slot's cache, back to the start of the image run it
// falls inside, if any: a run is evaluated whole or not at all.
func imageBoundary(toks []int, keep int, runs map[int]*imageRun) int {
	for keep > 0 && keep < len(toks) && toks[keep] < 0 && runs[toks[keep]] == nil {
		keep--
	}
	return keep
}

// TakesImages reports whether the model was loaded with a projector, so that its requests may carry images.
func (e *Engine) TakesImages() bool { return e.vision != nil }

// TokenizeImages turns a rendered prompt that holds parley.ImageMarker where its images go into tokens with a
// parley.ImageToken in each such place, as llama.cpp's multimodal tools tokenize one: each piece of text on its
// own, special-token text parsed, BOS (when the model wants one) at the start only, so that no BOS stands before
// an image.
func (e *Engine) TokenizeImages(text string) ([]int, error) {
	parts := strings.Split(text, parley.ImageMarker)
	var out []int
	for i, part := range parts {
		if i > 0 {
			out = append(out, parley.ImageToken)
		}
		if part == "" && i > 0 {
			continue
		}
		toks, err := e.tokenize(context.Background(), part, i == 0, true, 0)
		if err != nil {
			return nil, fmt.Errorf("tokenize: %w", err)
		}
		out = append(out, toks...)
	}
	return out, nil
}

// ImagePositions is how many prompt entries img takes (its embeddings and the tokens its model wraps an image in:
// KV cells, which the context counts, also where M-RoPE gives the embeddings fewer positions), so that the chat
// layer fits a conversation with images into the context before the engine expands them.
func (e *Engine) ImagePositions(img parley.Image) (int, error) {
	if e.vision == nil {
		return 0, parley.FieldErrorf("images", "this model takes no images (it was loaded without a projector)")
	}
	run, err := e.vision.tokenize(img)
	if err != nil {
		return 0, err
	}
	defer run.free()
	return len(run.pre) + run.n + len(run.post), nil
}
