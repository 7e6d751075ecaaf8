package chat_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/media"
)

// visionFake is the fake engine with a projector: it tokenizes around parley.ImageMarker as the engine does (one
// ImageToken in each place) and records the prompts it tokenized.
type visionFake struct {
	*fakeGen
	prompts []string
}

func (f *visionFake) TokenizeImages(text string) ([]int, error) {
	f.prompts = append(f.prompts, text)
	var out []int
	for i, part := range strings.Split(text, parley.ImageMarker) {
		if i > 0 {
			out = append(out, parley.ImageToken)
		}
		toks, _ := f.fakeGen.Tokenize(part)
		if i > 0 {
			toks = toks[1:] // BOS at the start only
		}
		out = append(out, toks...)
	}
	return out, nil
}

// fakeDecoder "decodes" an image to one pixel whose red is its first byte, and counts its decodes.
type fakeDecoder struct{ decodes int }

func (d *fakeDecoder) DecodeImage(_ context.Context, _ string, im parley.ImagePart) (int, int, []byte, error) {
	d.decodes++
	if len(im.Data) == 0 {
		return 0, 0, nil, media.ErrDecode
	}
	return 1, 1, []byte{im.Data[0], 0, 0}, nil
}

func imagePart(data string) parley.ImagePart {
	h := sha256.Sum256([]byte(data))
	return parley.ImagePart{SHA256: hex.EncodeToString(h[:]), MediaType: "image/png", Data: []byte(data)}
}

// A template that writes its own text for an image part, as vision models' templates do (this one is written for
// the test, in their manner), and one that knows only string content.
const (
	partsTemplate = `{% for m in messages %}<turn>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'image' %}<img-slot>{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}</turn>
{% endfor %}{% if add_generation_prompt %}<turn>assistant
{% endif %}`
	stringTemplate = `{% for m in messages %}[{{ m.role }}] {{ m.content }}
{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}`
)

func TestResponderImages(t *testing.T) {
	for _, tc := range []struct {
		name, src  string
		wantPrompt string
	}{
		{"template with image parts", partsTemplate, "<turn>user\n" + parley.ImageMarker + parley.ImageMarker + "What is it?</turn>\n<turn>assistant\n"},
		{"template with string content", stringTemplate, "[user] " + parley.ImageMarker + "\n" + parley.ImageMarker + "\nWhat is it?\n[assistant] "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &visionFake{fakeGen: newFake(512, tc.src, piece{text: "A"})}
			f.info.Vision = true
			dec := &fakeDecoder{}
			r := chat.NewResponder(f, chat.WithImageDecoder(dec), chat.WithTemplate(chat.NewJinja(tc.src, chat.JinjaConfig{})))
			msgs := []parley.Message{{Role: parley.RoleUser, Content: "What is it?", Images: []parley.ImagePart{imagePart("\x01one"), imagePart("\x02two")}}}
			rep, err := r.Reply(context.Background(), parley.ReplyRequest{Key: "k", User: "ann", Messages: msgs, Params: params(4)})
			if err != nil {
				t.Fatal(err)
			}
			collect(t, rep)
			if got := f.prompts[len(f.prompts)-1]; got != tc.wantPrompt {
				t.Errorf("prompt %q, want %q", got, tc.wantPrompt)
			}
			req := f.lastRequest(t)
			if len(req.Images) != 2 || req.Images[0].RGB[0] != 1 || req.Images[1].RGB[0] != 2 {
				t.Fatalf("images %+v", req.Images)
			}
			// Keys are the content hash within the user's scope: another user's are others.
			h := sha256.Sum256([]byte("\x01one"))
			if req.Images[0].Key != media.CacheKey(parley.UserCacheScope("ann"), h) {
				t.Errorf("key %x", req.Images[0].Key)
			}
			if req.Images[0].Key == media.CacheKey(parley.UserCacheScope("bob"), h) {
				t.Errorf("ann's key is bob's")
			}
			if n := countImageTokens(req.Tokens); n != 2 || req.Tokens[0] != 1 {
				t.Errorf("tokens %v: want BOS first and 2 image places", req.Tokens)
			}
		})
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

// A client's text that spells the image marker stays text; a model without a projector refuses an image part by
// name; an image that does not decode is a 400 naming its part.
func TestResponderImageRefusals(t *testing.T) {
	f := &visionFake{fakeGen: newFake(512, "", piece{text: "A"})}
	f.info.Vision = true
	var st media.Stats
	r := chat.NewResponder(f, chat.WithImageDecoder(&fakeDecoder{}), chat.WithImageStats(&st))
	msgs := []parley.Message{{Role: parley.RoleUser, Content: "say " + parley.ImageMarker, Images: []parley.ImagePart{imagePart("\x01")}}}
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: msgs, Params: params(4)})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	if n := countImageTokens(f.lastRequest(t).Tokens); n != 1 {
		t.Errorf("%d image places for one image: the client's marker was not neutralized", n)
	}

	bad := imagePart("x")
	bad.Data, bad.Part = nil, "messages[0].content[3]"
	_, err = r.Reply(context.Background(), parley.ReplyRequest{Messages: []parley.Message{{Role: parley.RoleUser, Content: "hi", Images: []parley.ImagePart{bad}}}, Params: params(4)})
	if pe, ok := err.(*parley.Error); !ok || pe.Code != parley.EInvalid || pe.Field != "messages[0].content[3]" {
		t.Errorf("an image that does not decode: %v", err)
	}

	f.info.Vision = false
	_, err = r.Reply(context.Background(), parley.ReplyRequest{Messages: msgs, Params: params(4)})
	if pe, ok := err.(*parley.Error); !ok || pe.Field != "messages[0].images[0]" || !strings.Contains(pe.Message, "does not see images") {
		t.Errorf("no projector: %v", err)
	}
	// Each refusal counted once, under its reason.
	snap := st.Snapshot()
	for r, n := range snap.Refused {
		want := int64(0)
		if r == media.ReasonNoVision || r == media.ReasonDecode {
			want = 1
		}
		if n != want {
			t.Errorf("%s: %d refusals, want %d", r, n, want)
		}
	}
}

// sizedFake is a vision fake whose images take 60 positions each, as a projector's run does.
type sizedFake struct{ *visionFake }

func (sizedFake) ImagePositions(parley.Image) (int, error) { return 60, nil }

// Fitting counts an image's positions: an old turn's image that would overflow the context is dropped with its
// turn, and the kept images are the newest.
func TestResponderFitsImagePositions(t *testing.T) {
	f := sizedFake{&visionFake{fakeGen: newFake(100, "", piece{text: "A"})}}
	f.info.Vision = true
	r := chat.NewResponder(f, chat.WithImageDecoder(&fakeDecoder{}))
	msgs := []parley.Message{
		{Role: parley.RoleUser, Content: "first", Images: []parley.ImagePart{imagePart("\x01old")}},
		{Role: parley.RoleAssistant, Content: "ok"},
		{Role: parley.RoleUser, Content: "second", Images: []parley.ImagePart{imagePart("\x02new")}},
	}
	rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: msgs, Params: params(10)})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, rep)
	req := f.lastRequest(t)
	if len(req.Images) != 1 || req.Images[0].RGB[0] != 2 || countImageTokens(req.Tokens) != 1 {
		t.Errorf("images %d (first red %v), %d places: want the newest image alone", len(req.Images), req.Images[0].RGB[0], countImageTokens(req.Tokens))
	}
}

// Images stand where the client put them among a message's text (ImagePart.Offset), for a template that iterates
// parts and for one that takes strings; a client's marker text before an image is neutralized without moving the
// image; a message whose images have no place puts them before its text.
func TestResponderImagesInterleaved(t *testing.T) {
	m, neutral := parley.ImageMarker, "<\u200b__media__>"
	text := "Look " + m + " here: between them, after."
	first, second := imagePart("\x01one"), imagePart("\x02two")
	first.Offset = len("Look " + m + " here: ")
	second.Offset = len("Look " + m + " here: between them, ")
	for _, tc := range []struct {
		name, src string
		images    []parley.ImagePart
		want      string
	}{
		{"template with image parts", partsTemplate, []parley.ImagePart{first, second},
			"<turn>user\nLook " + neutral + " here: " + m + "between them, " + m + "after.</turn>\n<turn>assistant\n"},
		{"template with string content", stringTemplate, []parley.ImagePart{first, second},
			"[user] Look " + neutral + " here: \n" + m + "\nbetween them, \n" + m + "\nafter.\n[assistant] "},
		{"image at the end, parts", partsTemplate, []parley.ImagePart{{SHA256: first.SHA256, Data: first.Data, Offset: len(text)}},
			"<turn>user\n" + strings.ReplaceAll(text, m, neutral) + m + "</turn>\n<turn>assistant\n"},
		{"no place given, strings", stringTemplate, []parley.ImagePart{imagePart("\x01one")},
			"[user] " + m + "\n" + strings.ReplaceAll(text, m, neutral) + "\n[assistant] "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &visionFake{fakeGen: newFake(512, tc.src, piece{text: "A"})}
			f.info.Vision = true
			r := chat.NewResponder(f, chat.WithImageDecoder(&fakeDecoder{}), chat.WithTemplate(chat.NewJinja(tc.src, chat.JinjaConfig{})))
			msgs := []parley.Message{{Role: parley.RoleUser, Content: text, Images: tc.images}}
			rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: msgs, Params: params(4)})
			if err != nil {
				t.Fatal(err)
			}
			collect(t, rep)
			if got := f.prompts[len(f.prompts)-1]; got != tc.want {
				t.Errorf("prompt\n%q, want\n%q", got, tc.want)
			}
			if req := f.lastRequest(t); len(req.Images) != len(tc.images) || req.Images[0].RGB[0] != 1 {
				t.Errorf("images %+v", req.Images)
			}
			if msgs[0].Images[0].Offset != tc.images[0].Offset || msgs[0].Content != text {
				t.Errorf("the request's message changed: %+v", msgs[0])
			}
		})
	}
}

// pngImage is an image part of a 4x4 PNG (48 bytes of pixels) whose first pixel's red is red.
func pngImage(t *testing.T, red uint8) parley.ImagePart {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, 4, 4))
	img.Set(0, 0, color.NRGBA{R: red, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return imagePart(b.String())
}

// The decoded images a MediaDecoder keeps are bounded by their bytes, least recently used dropped first: every
// image that fits is decoded once however many there are; past the bound the least recently used one is decoded
// again; an image larger than the bound, or another user's, is not found kept.
func TestMediaDecoderKeepsBytes(t *testing.T) {
	dec := media.NewDecoder(media.WithDecodeWorkers(1))
	defer dec.Close()
	ann := parley.UserCacheScope("ann")
	const px = 4 * 4 * 3
	decode := func(m *chat.MediaDecoder, scope string, im parley.ImagePart, red uint8) {
		t.Helper()
		w, h, rgb, err := m.DecodeImage(context.Background(), scope, im)
		if err != nil || w != 4 || h != 4 || rgb[0] != red {
			t.Fatalf("decode: %dx%d %v, %v", w, h, rgb[:min(3, len(rgb))], err)
		}
	}
	var images []parley.ImagePart
	for i := range 12 {
		images = append(images, pngImage(t, uint8(i+1)))
	}

	// Room for all twelve: the second round decodes none.
	m := chat.NewMediaDecoder(dec, media.Limits{}, 12*px, nil)
	for range 2 {
		for i, im := range images {
			decode(m, ann, im, uint8(i+1))
		}
	}
	if n := m.Decodes(); n != 12 {
		t.Errorf("twelve images twice with room for twelve: %d decodes, want 12", n)
	}
	decode(m, parley.UserCacheScope("bob"), images[0], 1)
	if n := m.Decodes(); n != 13 {
		t.Errorf("another user's image: %d decodes, want 13 (never found among ann's)", n)
	}

	// Room for two: a, b, a (kept), c (drops b, the least recently used), a (kept), b (decoded again).
	var st media.Stats
	m = chat.NewMediaDecoder(dec, media.Limits{}, 2*px+px/2, &st)
	for _, i := range []int{0, 1, 0, 2, 0, 1} {
		decode(m, ann, images[i], uint8(i+1))
	}
	if n := m.Decodes(); n != 4 {
		t.Errorf("room for two: %d decodes, want 4", n)
	}
	if snap := st.Snapshot(); snap.Decodes != 4 || snap.Kept != 2 || snap.DecodeTime <= 0 {
		t.Errorf("room for two: the stats count %d decodes in %v and %d found kept, want 4 and 2", snap.Decodes, snap.DecodeTime, snap.Kept)
	}

	// Room for less than one image: nothing is kept.
	m = chat.NewMediaDecoder(dec, media.Limits{}, px-1, nil)
	decode(m, ann, images[0], 1)
	decode(m, ann, images[0], 1)
	if n := m.Decodes(); n != 2 {
		t.Errorf("no room: %d decodes, want 2", n)
	}
}
