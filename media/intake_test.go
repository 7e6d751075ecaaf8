package media_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"image"
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"
	"strings"
	"testing"

	_ "golang.org/x/image/webp"

	"github.com/parley-chat/parley/media"
)

func TestReadHeaderMatchesTheDecoders(t *testing.T) {
	img := pattern(37, 21)
	gifFrame := encodeGIF(t, img)
	cases := map[string]struct {
		data []byte
		want media.Header
	}{
		"png":           {encodePNG(t, img), media.Header{Format: media.PNG, Width: 37, Height: 21}},
		"jpeg":          {encodeJPEG(t, img), media.Header{Format: media.JPEG, Width: 37, Height: 21}},
		"gif":           {gifFrame, media.Header{Format: media.GIF, Width: 37, Height: 21}},
		"webp lossless": {readFile(t, "testdata/5x3-lossless.webp"), media.Header{Format: media.WebP, Width: 5, Height: 3}},
		"webp lossy":    {readFile(t, "testdata/5x3-lossy.webp"), media.Header{Format: media.WebP, Width: 5, Height: 3}},
	}
	for name, c := range cases {
		got, err := media.ReadHeader(c.data)
		if err != nil || got != c.want {
			t.Errorf("%s: ReadHeader = %+v, %v; want %+v", name, got, err, c.want)
			continue
		}
		// The standard decoders read the same size.
		cfg, _, err := image.DecodeConfig(bytes.NewReader(c.data))
		if err != nil || cfg.Width != got.Width || cfg.Height != got.Height {
			t.Errorf("%s: image.DecodeConfig = %dx%d, %v; ReadHeader %dx%d", name, cfg.Width, cfg.Height, err, got.Width, got.Height)
		}
	}
}

func TestSniffRefusesOtherFormatsByName(t *testing.T) {
	cases := map[string]string{
		"BM\x36\x00\x00\x00\x00\x00":                    "BMP",
		"II*\x00\x08\x00\x00\x00":                       "TIFF",
		"MM\x00*\x00\x00\x00\x08":                       "TIFF",
		"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00":      "HEIC",
		"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00":      "AVIF",
		"\xef\xbb\xbf  <svg xmlns='http://www.w3.org'>": "SVG",
		"<?xml version='1.0'?><svg/>":                   "SVG",
		"%PDF-1.7\n":                                    "PDF",
		"\x00\x00\x00\x0cJXL \r\n\x87\n":                "JPEG XL",
		"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00":      `brand "mp42"`,
		"hello, world":                                  `starts "hello, w"`,
		"":                                              "not a PNG, JPEG, WebP or GIF",
		"\x89PNX\r\n\x1a\n\x00\x00\x00\x0dIHDR":         "not a PNG",
		"RIFF\x00\x00\x00\x00WAVEfmt ":                  "not a PNG",
	}
	for data, want := range cases {
		_, err := media.Sniff([]byte(data))
		if !errors.Is(err, media.ErrFormat) || !strings.Contains(err.Error(), want) {
			t.Errorf("Sniff(%q) = %v; want ErrFormat naming %s", data, err, want)
		}
	}
}

func TestReadHeaderRefusesBrokenHeaders(t *testing.T) {
	png := encodePNG(t, pattern(4, 4))
	jpg := encodeJPEG(t, pattern(4, 4))
	webpVP8X := func(flags byte) []byte {
		b := []byte("RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00")
		return append(b, flags, 0, 0, 0, 3, 0, 0, 2, 0, 0)
	}
	cases := map[string]struct {
		data []byte
		want string
	}{
		"png cut in IHDR":            {png[:20], "cut short"},
		"png without IHDR first":     {append(png[:8:8], pngChunk("tEXt", []byte("0123456789abc"))...), "not IHDR"},
		"png of zero width":          {pngHeaderOnly(0, 5), "0x5"},
		"png of 2^32-1 width":        {pngHeaderOnly(1<<32-1, 5), "4294967295x5"},
		"jpeg cut before the frame":  {jpg[:4], "cut short"},
		"jpeg without a frame":       {[]byte("\xff\xd8\xff\xda\x00\x02"), "no frame header"},
		"jpeg arithmetic":            {[]byte("\xff\xd8\xff\xc9\x00\x0b\x08\x00\x10\x00\x10\x01\x01\x11\x00"), "arithmetic"},
		"jpeg lossless":              {[]byte("\xff\xd8\xff\xc3\x00\x0b\x08\x00\x10\x00\x10\x01\x01\x11\x00"), "lossless"},
		"jpeg of height zero (DNL)":  {[]byte("\xff\xd8\xff\xc0\x00\x0b\x08\x00\x00\x00\x10\x01\x01\x11\x00"), "DNL"},
		"jpeg with a bad length":     {[]byte("\xff\xd8\xff\xe0\x00\x01"), "length 1"},
		"webp animated":              {webpVP8X(0x02), "animated"},
		"webp unknown chunk":         {[]byte("RIFF\x00\x00\x00\x00WEBPABCD\x00\x00\x00\x00"), "unknown first chunk"},
		"webp lossy without a start": {[]byte("RIFF\x00\x00\x00\x00WEBPVP8 \x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05\x00\x05\x00"), "start code"},
		"gif cut in the screen":      {[]byte("GIF89a\x05\x00"), "cut short"},
		"gif without an image":       {[]byte("GIF89a\x05\x00\x05\x00\x00\x00\x00\x3b"), "no image"},
	}
	for name, c := range cases {
		h, err := media.ReadHeader(c.data)
		if !errors.Is(err, media.ErrMalformed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ReadHeader = %+v, %v; want ErrMalformed saying %q", name, h, err, c.want)
		}
	}
	if _, err := media.ReadHeader(png[:6]); !errors.Is(err, media.ErrFormat) {
		t.Errorf("a PNG cut in its magic: %v; want ErrFormat", err)
	}
	// A still VP8X reads its canvas size.
	if h, err := media.ReadHeader(webpVP8X(0x10)); err != nil || h.Width != 4 || h.Height != 3 {
		t.Errorf("VP8X: %+v, %v; want 4x3", h, err)
	}
}

// A bomb is refused from its header: the pixels it declares, never decoded.
func TestCheckRefusesBombsBeforeDecoding(t *testing.T) {
	lim := media.Limits{}
	cases := map[string][]byte{
		"png 100000x100000 header":  pngHeaderOnly(100000, 100000),
		"png 5000x5000 (25 MP)":     pngHeaderOnly(5000, 5000),
		"png 20000x10 (long side)":  pngHeaderOnly(20000, 10),
		"jpeg 65535x65535":          []byte("\xff\xd8\xff\xc0\x00\x11\x08\xff\xff\xff\xff\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"),
		"gif frame past its screen": []byte("GIF89a\x01\x00\x01\x00\x00\x00\x00\x2c\x00\x00\x00\x00\xff\xff\xff\xff\x00"),
		"webp lossless 16384x16384": append([]byte("RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f"), 0xff, 0xff, 0xff, 0x0f),
	}
	for name, data := range cases {
		im, err := lim.Check(data)
		if !errors.Is(err, media.ErrTooLarge) {
			t.Errorf("%s: Check = %+v, %v; want ErrTooLarge", name, im, err)
		}
	}
	// A real bomb: 4096x4097 grey pixels in a small file.
	bomb := pngBomb(t, 4096, 4097)
	if len(bomb) > 4096*4097/100 {
		t.Fatalf("the bomb is %d bytes", len(bomb))
	}
	if _, err := lim.Check(bomb); !errors.Is(err, media.ErrTooLarge) || !strings.Contains(err.Error(), "4096x4097") {
		t.Errorf("bomb: %v; want ErrTooLarge naming 4096x4097", err)
	}
	// Within the limits it is accepted.
	if _, err := (media.Limits{MaxPixels: 4096 * 4097}).Check(bomb); err != nil {
		t.Errorf("bomb under a larger pixel limit: %v", err)
	}
}

func TestCheckLimits(t *testing.T) {
	png := encodePNG(t, pattern(8, 4))
	if _, err := (media.Limits{MaxBytes: int64(len(png) - 1)}).Check(png); !errors.Is(err, media.ErrTooLarge) {
		t.Errorf("bytes: %v", err)
	}
	if _, err := (media.Limits{MaxPixels: 31}).Check(png); !errors.Is(err, media.ErrTooLarge) {
		t.Errorf("pixels: %v", err)
	}
	if _, err := (media.Limits{MaxSide: 7}).Check(png); !errors.Is(err, media.ErrTooLarge) {
		t.Errorf("side: %v", err)
	}
	_, err := (media.Limits{Formats: []media.Format{media.JPEG}}).Check(png)
	if !errors.Is(err, media.ErrFormat) || !strings.Contains(err.Error(), "PNG images are not accepted here (JPEG are)") {
		t.Errorf("format: %v", err)
	}
	im, err := (media.Limits{MaxBytes: int64(len(png)), MaxPixels: 32, MaxSide: 8}).Check(png)
	if err != nil {
		t.Fatal(err)
	}
	if im.Width != 8 || im.Height != 4 || im.MediaType() != "image/png" || im.Hash != sha256.Sum256(png) {
		t.Errorf("image %+v", im.Header)
	}
}

func TestParseSource(t *testing.T) {
	png := encodePNG(t, pattern(3, 2))
	std := base64.StdEncoding.EncodeToString(png)
	url := base64.RawURLEncoding.EncodeToString(png)
	wrapped := ""
	for i := 0; i < len(std); i += 60 {
		wrapped += std[i:min(i+60, len(std))] + "\r\n"
	}
	good := map[string]string{
		"data url":                  "data:image/png;base64," + std,
		"data url, other type":      "data:image/jpeg;base64," + std, // the magic decides
		"data url, no type":         "data:;base64," + std,
		"data url, parameters":      "DATA:image/png;name=x.png;BASE64," + std,
		"data url, octet-stream":    "data:application/octet-stream;base64," + std,
		"bare base64":               std,
		"url alphabet, unpadded":    url,
		"wrapped lines":             wrapped,
		"data url of wrapped lines": "data:image/png;base64," + wrapped,
	}
	for name, src := range good {
		got, err := media.ParseSource(src, 1<<20)
		if err != nil || !bytes.Equal(got, png) {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	bad := map[string]struct {
		src  string
		want error
	}{
		"http url":             {"http://example.com/cat.png", media.ErrRemoteOff},
		"https url":            {"HTTPS://example.com/cat.png", media.ErrRemoteOff},
		"file url":             {"file:///etc/passwd", media.ErrRemote},
		"gopher url":           {"gopher://127.0.0.1:6379/_FLUSHALL", media.ErrRemote},
		"data url, text":       {"data:text/html;base64," + std, media.ErrFormat},
		"data url, not base64": {"data:image/png," + string(png[:8]), media.ErrEncoding},
		"data url, no comma":   {"data:image/png;base64", media.ErrEncoding},
		"empty":                {"", media.ErrEncoding},
		"bad characters":       {"iVBOR*w0KGgo", media.ErrEncoding},
		"data after padding":   {"QQ==QQ==", media.ErrEncoding},
		"too large":            {std + std, media.ErrTooLarge},
	}
	for name, c := range bad {
		_, err := media.ParseSource(c.src, int64(len(png)+2))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", name, err, c.want)
		}
	}
}

func TestBatchNamesThePartAndCounts(t *testing.T) {
	png := "data:image/png;base64," + base64.StdEncoding.EncodeToString(encodePNG(t, pattern(3, 2)))
	b := media.Limits{MaxImages: 2}.NewBatch()
	for _, part := range []string{"messages[0].content[1]", "messages[2].content[0]"} {
		if _, err := b.Add(part, png); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.Add("messages[3].content[0]", png)
	var pe *media.PartError
	if !errors.As(err, &pe) || pe.Part != "messages[3].content[0]" || !errors.Is(err, media.ErrTooMany) {
		t.Errorf("third image: %v; want ErrTooMany for messages[3].content[0]", err)
	}
	b = media.Limits{}.NewBatch()
	_, err = b.Add("input[1].content[0]", "data:image/png;base64,"+base64.StdEncoding.EncodeToString([]byte("BM123456")))
	if !errors.As(err, &pe) || pe.Part != "input[1].content[0]" || !strings.HasPrefix(err.Error(), "input[1].content[0]: unsupported image format: BMP") {
		t.Errorf("a BMP: %v", err)
	}
	if _, err := b.AddBytes("messages[0].images[0]", encodeJPEG(t, pattern(2, 2))); err != nil || len(b.Images()) != 1 {
		t.Errorf("AddBytes: %v, %d images", err, len(b.Images()))
	}
}

func TestCacheKeyHoldsTheUser(t *testing.T) {
	h1, h2 := sha256.Sum256([]byte("one")), sha256.Sum256([]byte("two"))
	keys := map[[32]byte]string{}
	for _, c := range []struct {
		user string
		hash [32]byte
	}{{"alice", h1}, {"bob", h1}, {"alice", h2}, {"", h1}, {"alic", h1}} {
		k := media.CacheKey(c.user, c.hash)
		if prev, ok := keys[k]; ok {
			t.Errorf("%s/%x and %s share a key", c.user, c.hash[:4], prev)
		}
		keys[k] = c.user
		if media.CacheKey(c.user, c.hash) != k {
			t.Errorf("CacheKey is not stable")
		}
	}
}
