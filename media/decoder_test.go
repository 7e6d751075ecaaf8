package media_test

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/color"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley/media"
)

// hangWait bounds what must end: it only catches a hang.
const hangWait = time.Minute

func newDecoder(t *testing.T, opts ...media.DecoderOption) *media.Decoder {
	t.Helper()
	d := media.NewDecoder(append([]media.DecoderOption{media.WithDecodeTimeout(hangWait)}, opts...)...)
	t.Cleanup(func() { d.Close() })
	return d
}

func decode(t *testing.T, d *media.Decoder, data []byte) (*media.Decoded, error) {
	t.Helper()
	im, err := media.Limits{}.Check(data)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return d.Decode(context.Background(), im)
}

func TestDecoderDecodesEachFormatToRGB(t *testing.T) {
	d := newDecoder(t)
	// A paletted copy of the pattern, so that GIF keeps its colours exactly.
	src := pattern(5, 3)
	var pal color.Palette
	for y := range 3 {
		for x := range 5 {
			pal = append(pal, src.At(x, y))
		}
	}
	paletted := image.NewPaletted(src.Bounds(), pal)
	for y := range 3 {
		for x := range 5 {
			paletted.Set(x, y, src.At(x, y))
		}
	}
	// Transparent pixels keep their colour (stb_image drops alpha without compositing); 16-bit samples keep their
	// high byte; grey is repeated.
	alpha := image.NewNRGBA(image.Rect(0, 0, 2, 1))
	alpha.Pix = []byte{10, 20, 30, 0, 40, 50, 60, 128}
	deep := image.NewNRGBA64(image.Rect(0, 0, 1, 1))
	deep.Pix = []byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xff, 0xff}
	grey := image.NewGray(image.Rect(0, 0, 2, 1))
	grey.Pix = []byte{7, 250}
	cases := map[string]struct {
		data []byte
		w, h int
		rgb  []byte
	}{
		"png":           {encodePNG(t, src), 5, 3, patternRGB(5, 3)},
		"png alpha":     {encodePNG(t, alpha), 2, 1, []byte{10, 20, 30, 40, 50, 60}},
		"png 16-bit":    {encodePNG(t, deep), 1, 1, []byte{0x12, 0x56, 0x9a}},
		"png grey":      {encodePNG(t, grey), 2, 1, []byte{7, 7, 7, 250, 250, 250}},
		"gif":           {encodeGIF(t, paletted), 5, 3, patternRGB(5, 3)},
		"webp lossless": {readFile(t, "testdata/5x3-lossless.webp"), 5, 3, patternRGB(5, 3)},
	}
	for name, c := range cases {
		got, err := decode(t, d, c.data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got.Width != c.w || got.Height != c.h || !bytes.Equal(got.RGB, c.rgb) {
			t.Errorf("%s: %dx%d %v; want %dx%d %v", name, got.Width, got.Height, got.RGB, c.w, c.h, c.rgb)
		}
	}
	// Lossy formats: near the source.
	flat := image.NewNRGBA(image.Rect(0, 0, 16, 16))
	for i := 0; i < len(flat.Pix); i += 4 {
		copy(flat.Pix[i:], []byte{200, 100, 50, 255})
	}
	lossy := map[string]struct {
		data []byte
		want []byte
	}{
		"jpeg":       {encodeJPEG(t, flat), []byte{200, 100, 50}},
		"webp lossy": {readFile(t, "testdata/5x3-lossy.webp"), nil},
	}
	for name, c := range lossy {
		got, err := decode(t, d, c.data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(got.RGB) != got.Width*got.Height*3 {
			t.Errorf("%s: %d bytes for %dx%d", name, len(got.RGB), got.Width, got.Height)
		}
		for i, v := range c.want {
			if diff := int(got.RGB[i]) - int(v); diff < -4 || diff > 4 {
				t.Errorf("%s: channel %d is %d, want about %d", name, i, got.RGB[i], v)
			}
		}
	}
	if n := d.Started(); n != 2 && n != 1 {
		t.Errorf("%d children started for good images, want one per worker at most", n)
	}
}

// Hostile files are refused by the child, which survives them: no child is started again.
func TestDecoderRefusesHostileFiles(t *testing.T) {
	d := newDecoder(t, media.WithDecodeWorkers(1))
	good := encodePNG(t, pattern(5, 3))
	jpg := encodeJPEG(t, pattern(32, 32))
	gifData := encodeGIF(t, pattern(8, 8))
	cases := map[string]struct {
		data []byte
		want error
		says string
	}{
		"png cut in its data":        {good[:len(good)-20], media.ErrDecode, "png"},
		"png with a bad checksum":    {append(append([]byte{}, good[:len(good)-13]...), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), media.ErrDecode, "png"},
		"jpeg cut in its scan":       {jpg[:len(jpg)/2], media.ErrDecode, "jpeg"},
		"gif cut in its frame":       {gifData[:len(gifData)-8], media.ErrDecode, "gif"},
		"a bomb past Check":          {pngHeaderOnly(100000, 100000), media.ErrTooLarge, "100000x100000"},
		"not an image":               {[]byte("BM\x00\x00\x00\x00"), media.ErrFormat, "BMP"},
		"png header, jpeg body":      {append(pngHeaderOnly(4, 4), jpg[2:]...), media.ErrDecode, "png"},
		"webp lossless cut":          {readFile(t, "testdata/5x3-lossless.webp")[:40], media.ErrDecode, "webp"},
		"webp with a lying VP8L box": {append([]byte("RIFF\xff\xff\xff\xffWEBPVP8L\xff\xff\xff\xff\x2f"), 0x04, 0x80, 0x00, 0x00), media.ErrDecode, "webp"},
	}
	for name, c := range cases {
		// Straight to the decoder, past Check: the child checks again.
		_, err := d.Decode(context.Background(), &media.Image{Data: c.data})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want %v saying %q", name, err, c.want, c.says)
		}
		if got, err := decode(t, d, good); err != nil || !bytes.Equal(got.RGB, patternRGB(5, 3)) {
			t.Fatalf("after %s, a good image: %v", name, err)
		}
	}
	if n := d.Started(); n != 1 {
		t.Errorf("%d children started; refusals must not cost the child", n)
	}
}

// A child that dies (here of its memory limit, on a bomb within the pixel limits) fails its decode and is
// replaced on the next.
func TestDecoderSurvivesItsChildDying(t *testing.T) {
	lim := media.Limits{MaxPixels: 16384 * 16384}
	d := newDecoder(t, media.WithDecodeWorkers(1), media.WithDecoderMemory(512<<20), media.WithDecodeLimits(lim))
	// 16000x16000 RGB: the PNG decoder allocates 1 GB of RGBA for it before it reads a row.
	bomb := append(pngHeaderOnly(16000, 16000), pngBomb(t, 1, 1)[33:]...)
	im, err := lim.Check(bomb)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Decode(context.Background(), im)
	if !errors.Is(err, media.ErrDecode) || !strings.Contains(err.Error(), "died") {
		t.Fatalf("a bomb past the memory limit: %v; want ErrDecode, the decoder died", err)
	}
	t.Log(err)
	good := encodePNG(t, pattern(5, 3))
	if got, err := decode(t, d, good); err != nil || !bytes.Equal(got.RGB, patternRGB(5, 3)) {
		t.Fatalf("after the child died, a good image: %v", err)
	}
	if n := d.Started(); n != 2 {
		t.Errorf("%d children started, want 2 (one died)", n)
	}
}

// A real bomb at the pixel limit decodes under the default memory limit.
func TestDecoderDecodesABombAtTheLimit(t *testing.T) {
	d := newDecoder(t, media.WithDecodeWorkers(1))
	got, err := decode(t, d, pngBomb(t, 4096, 4096))
	if err != nil || got.Width != 4096 || len(got.RGB) != 4096*4096*3 {
		t.Fatalf("4096x4096: %v", err)
	}
}

// A decode past the time limit ends its child; the next decode starts another.
func TestDecoderTimeLimit(t *testing.T) {
	d := media.NewDecoder(media.WithDecodeWorkers(1), media.WithDecodeTimeout(time.Nanosecond))
	defer d.Close()
	im, err := media.Limits{}.Check(encodePNG(t, pattern(5, 3)))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := d.Decode(context.Background(), im)
		if !errors.Is(err, media.ErrDecode) || !strings.Contains(err.Error(), "took longer") {
			t.Fatalf("%v; want ErrDecode, took longer", err)
		}
	}
	if n := d.Started(); n != 2 {
		t.Errorf("%d children started, want 2 (each decode killed its own)", n)
	}
}

func TestDecoderContextAndClose(t *testing.T) {
	d := media.NewDecoder()
	im, err := media.Limits{}.Check(encodePNG(t, pattern(5, 3)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Decode(ctx, im); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled context: %v", err)
	}
	// Many decodes share the workers.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := d.Decode(context.Background(), im)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := d.Started(); n > media.DefaultDecodeWorkers {
		t.Errorf("%d children for %d workers", n, media.DefaultDecodeWorkers)
	}
	d.Close()
	if _, err := d.Decode(context.Background(), im); err == nil {
		t.Error("a decode after Close succeeded")
	}
}

func TestDecodedPNM(t *testing.T) {
	d := &media.Decoded{Width: 2, Height: 1, RGB: []byte{1, 2, 3, 4, 5, 6}}
	if got := string(d.PNM()); got != "P6\n2 1\n255\n\x01\x02\x03\x04\x05\x06" {
		t.Errorf("PNM %q", got)
	}
	// A client cannot send one: it is the engine's format, not an accepted one.
	if _, err := media.Sniff(d.PNM()); !errors.Is(err, media.ErrFormat) {
		t.Errorf("Sniff(PNM) = %v", err)
	}
}
