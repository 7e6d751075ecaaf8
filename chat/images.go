package chat

import (
	"container/list"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/media"
)

// Images in a conversation. A message's images reach the prompt as parley.ImageMarker, one line each where the
// client put it among the message's text (llama.cpp's multimodal tools use the same marker); the engine's TokenizeImages then tokenizes the
// text between the markers, BOS at the start only, and puts a parley.ImageToken where each marker was. The images
// themselves are decoded for every reply from the bytes the messages carry (a stored conversation keeps them), in
// the sandboxed decoder's child, and keyed for the engine's caches by their content hash within the request's
// cache scope (media.CacheKey), so a later turn that repeats an image reuses the KV it left, and no other scope
// ever does.

// ImageDecoder turns an image's bytes into pixels. MediaDecoder is the server's, over media's sandboxed child.
// scope is the request's cache scope: a decoder that keeps decoded images keeps them within it.
type ImageDecoder interface {
	DecodeImage(ctx context.Context, scope string, im parley.ImagePart) (width, height int, rgb []byte, err error)
}

// ImageTokenizer is a Generator that tokenizes a prompt holding images (llm.Engine is one).
type ImageTokenizer interface {
	TokenizeImages(text string) ([]int, error)
}

// ImageSizer is a Generator that tells how many prompt positions an image takes (llm.Engine is one): fitting a
// conversation counts them, not one token per image. Without it an image counts as one token and the engine
// refuses a prompt its images make too long.
type ImageSizer interface {
	ImagePositions(img parley.Image) (int, error)
}

// imagePositions is how many positions each image takes (1 each when the generator cannot say).
func (r *Responder) imagePositions(images []parley.Image) ([]int, error) {
	out := make([]int, len(images))
	is, ok := r.gen.(ImageSizer)
	for i, img := range images {
		out[i] = 1
		if !ok {
			continue
		}
		n, err := is.ImagePositions(img)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// WithImageDecoder sets what decodes the images of a conversation. Without one a conversation with images is
// refused.
func WithImageDecoder(d ImageDecoder) Option {
	return func(r *Responder) { r.images = d }
}

// WithImageStats makes the responder count the images it refuses into st (a model without a projector, an image
// that does not decode), for /metrics. The web layer counts those it refuses at the edge into the same Stats.
func WithImageStats(st *media.Stats) Option {
	return func(r *Responder) { r.imageStats = st }
}

// ImageError is err, a refusal of the image part names, as the client hears it: a 400 naming the part for an
// image at fault, a 503 when the decoder could not run.
func ImageError(part string, err error) error {
	var pe *parley.Error
	if errors.As(err, &pe) {
		return err
	}
	var me *media.PartError
	if errors.As(err, &me) {
		part, err = me.Part, me.Err
	}
	if errors.Is(err, media.ErrDecoder) {
		return parley.Errorf(parley.EUnavailable, "%s: %v", part, err)
	}
	return parley.FieldErrorf(part, "%v", err)
}

// imagePart names where im came from: the request's part, or its place in the conversation.
func imagePart(im parley.ImagePart, msg, i int) string {
	if im.Part != "" {
		return im.Part
	}
	return fmt.Sprintf("messages[%d].images[%d]", msg, i)
}

// checkImages refuses images the model cannot take: a model without a projector, a responder without a decoder.
func (r *Responder) checkImages(msgs []parley.Message, info parley.ModelInfo) error {
	for i, m := range msgs {
		for j, im := range m.Images {
			switch {
			case !info.Vision:
				r.imageStats.RefusedFor(media.ReasonNoVision)
				return parley.FieldErrorf(imagePart(im, i, j), "this model does not see images (it was loaded without a vision projector, --mmproj)")
			case r.images == nil:
				r.imageStats.RefusedFor(media.ReasonNoVision)
				return parley.FieldErrorf(imagePart(im, i, j), "this server decodes no images")
			}
			if _, ok := r.gen.(ImageTokenizer); !ok {
				r.imageStats.RefusedFor(media.ReasonNoVision)
				return parley.FieldErrorf(imagePart(im, i, j), "this engine takes no images")
			}
		}
	}
	return nil
}

// withImageMarkers returns msgs with each image as a parley.ImageMarker line where the client put it among its
// message's text (before the text when it gave no place; msgs itself is not changed). The text was neutralized
// before, the marker included, so only these markers remain.
func withImageMarkers(msgs []parley.Message) []parley.Message {
	if parley.ImageCount(msgs) == 0 {
		return msgs
	}
	out := append([]parley.Message(nil), msgs...)
	for i, m := range out {
		if len(m.Images) == 0 {
			continue
		}
		var b strings.Builder
		for j, seg := range parley.ContentSegments(m) {
			b.WriteString(seg)
			if j == len(m.Images) {
				break
			}
			if seg != "" && !strings.HasSuffix(seg, "\n") {
				b.WriteString("\n") // the marker starts a line
			}
			b.WriteString(parley.ImageMarker + "\n")
		}
		out[i].Content = b.String()
	}
	return out
}

// decodeImages decodes the images of msgs in order, one decode per distinct image, and keys each for the engine.
// scope is the request's cache scope.
func (r *Responder) decodeImages(ctx context.Context, scope string, msgs []parley.Message) ([]parley.Image, error) {
	byHash := map[string]parley.Image{}
	var out []parley.Image
	for i, m := range msgs {
		for j, im := range m.Images {
			if d, ok := byHash[im.SHA256]; ok {
				out = append(out, d)
				continue
			}
			w, h, rgb, err := r.images.DecodeImage(ctx, scope, im)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				r.imageStats.Refused(err)
				return nil, ImageError(imagePart(im, i, j), err)
			}
			var hash [32]byte
			if b, err := hex.DecodeString(im.SHA256); err != nil || len(b) != 32 {
				return nil, parley.FieldErrorf(imagePart(im, i, j), "the image's sha256 %q is not one", im.SHA256)
			} else {
				copy(hash[:], b)
			}
			d := parley.Image{Key: media.CacheKey(scope, hash), Width: w, Height: h, RGB: rgb}
			byHash[im.SHA256] = d
			out = append(out, d)
		}
	}
	return out, nil
}

// MediaDecoder is the server's ImageDecoder: each image is checked again under the limits (a stored conversation's
// image was accepted under the limits of its day) and decoded in media's sandboxed child. Decoded images are kept,
// least recently used dropped first, up to a bound on their pixels' bytes, so that the turns of conversations do
// not decode their images again.
type MediaDecoder struct {
	dec     *media.Decoder
	limits  media.Limits
	keep    int64        // the most bytes of pixels kept (<= 0: none)
	decodes atomic.Int64 // images decoded (not found kept)
	stats   *media.Stats // counts decodes and images found kept (nil: none)

	mu    sync.Mutex
	held  int64                      // bytes of pixels kept now; at most keep
	lru   *list.List                 // of *decodedImage, most recently used at the front
	byKey map[[32]byte]*list.Element // lru's elements by their image's key
}

// decodedImage is a decoded image kept under its cache key (the request's scope and the image's hash): a scope
// never finds what another decoded, which a decode's time would otherwise tell it.
type decodedImage struct {
	key [32]byte
	d   *media.Decoded
}

// NewMediaDecoder returns an ImageDecoder over dec under limits that keeps up to keepBytes of decoded pixels
// (media.DefaultDecodedCacheBytes, usually; <= 0 keeps none), and counts its decodes and the images it finds kept
// into stats (nil: nowhere).
func NewMediaDecoder(dec *media.Decoder, limits media.Limits, keepBytes int64, stats *media.Stats) *MediaDecoder {
	return &MediaDecoder{dec: dec, limits: limits, keep: keepBytes, stats: stats, lru: list.New(), byKey: map[[32]byte]*list.Element{}}
}

// Decodes is how many images m has decoded: those it did not find kept.
func (m *MediaDecoder) Decodes() int64 { return m.decodes.Load() }

// DecodeImage implements ImageDecoder.
func (m *MediaDecoder) DecodeImage(ctx context.Context, scope string, part parley.ImagePart) (int, int, []byte, error) {
	im, err := m.limits.Check(part.Data)
	if err != nil {
		return 0, 0, nil, err
	}
	key := media.CacheKey(scope, im.Hash)
	m.mu.Lock()
	if el, ok := m.byKey[key]; ok {
		m.lru.MoveToFront(el)
		d := el.Value.(*decodedImage).d
		m.mu.Unlock()
		m.stats.FoundKept()
		return d.Width, d.Height, d.RGB, nil
	}
	m.mu.Unlock()
	t0 := time.Now()
	d, err := m.dec.Decode(ctx, im)
	if err != nil {
		return 0, 0, nil, err
	}
	m.decodes.Add(1)
	m.stats.Decoded(time.Since(t0))
	m.store(key, d)
	return d.Width, d.Height, d.RGB, nil
}

// store keeps d under key, dropping the least recently used images until what is kept fits the bound; an image
// larger than the bound is not kept.
func (m *MediaDecoder) store(key [32]byte, d *media.Decoded) {
	size := int64(len(d.RGB))
	if size > m.keep {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[key]; ok { // decoded meanwhile by another request
		m.lru.MoveToFront(el)
		return
	}
	m.byKey[key] = m.lru.PushFront(&decodedImage{key, d})
	m.held += size
	for m.held > m.keep {
		old := m.lru.Remove(m.lru.Back()).(*decodedImage)
		delete(m.byKey, old.key)
		m.held -= int64(len(old.d.RGB))
	}
}

func countImageTokens(toks []int) int {
	n := 0
	for _, t := range toks {
		if t == parley.ImageToken {
			n++
		}
	}
	return n
}

// imageExtra is the positions a prompt's images take beyond the one token each stands for in toks: its images are
// the last of the conversation's (positions, in order).
func imageExtra(toks []int, positions []int) int {
	k := countImageTokens(toks)
	if k == 0 || k > len(positions) {
		return 0
	}
	extra := 0
	for _, n := range positions[len(positions)-k:] {
		extra += n - 1
	}
	return extra
}
