package media_test

import (
	"bytes"
	"errors"
	"image"
	"image/jpeg"
	"image/png"
	"testing"

	"github.com/parley-chat/parley/media"
)

// fuzzSeeds are the hostile shapes the fuzz targets start from: each format whole, cut short, with the wrong
// magic, with huge dimensions, and bombs.
func fuzzSeeds(f *testing.F) {
	f.Helper()
	src := pattern(13, 7)
	good := [][]byte{
		encodePNG(f, src), encodeJPEG(f, src), encodeGIF(f, src),
		readFile(f, "testdata/5x3-lossless.webp"), readFile(f, "testdata/5x3-lossy.webp"),
	}
	for _, g := range good {
		f.Add(g)
		f.Add(g[:len(g)/2]) // truncated
		f.Add(g[:12])
		wrong := append([]byte{}, g...)
		wrong[1] ^= 0xff // wrong magic
		f.Add(wrong)
	}
	f.Add(pngHeaderOnly(100000, 100000))
	f.Add(pngHeaderOnly(1<<31-1, 1))
	f.Add(append(pngHeaderOnly(16000, 16000), pngBomb(f, 1, 1)[33:]...))
	f.Add(pngBomb(f, 300, 300))
	f.Add([]byte("\xff\xd8\xff\xc0\x00\x11\x08\xff\xff\xff\xff\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"))
	f.Add([]byte("GIF89a\x01\x00\x01\x00\x00\x00\x00\x2c\x00\x00\x00\x00\xff\xff\xff\xff\x00"))
	f.Add(append([]byte("RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f"), 0xff, 0xff, 0xff, 0x0f))
	f.Add([]byte("RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x02\x00\x00"))
}

// ReadHeader never panics, and where the standard decoders read a PNG's or a JPEG's size too, they read the same.
func FuzzReadHeader(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := media.ReadHeader(data)
		if err != nil {
			if !errors.Is(err, media.ErrFormat) && !errors.Is(err, media.ErrMalformed) {
				t.Fatalf("an error outside the sentinels: %v", err)
			}
			return
		}
		if h.Width <= 0 || h.Height <= 0 {
			t.Fatalf("accepted %+v", h)
		}
		var cfg image.Config
		switch h.Format {
		case media.PNG:
			cfg, err = png.DecodeConfig(bytes.NewReader(data))
		case media.JPEG:
			cfg, err = jpeg.DecodeConfig(bytes.NewReader(data))
		default:
			return
		}
		if err == nil && (cfg.Width != h.Width || cfg.Height != h.Height) {
			t.Fatalf("ReadHeader %dx%d, DecodeConfig %dx%d", h.Width, h.Height, cfg.Width, cfg.Height)
		}
	})
}

// The child's decode never panics (a decoder's own panic is turned into a refusal inside), never returns more
// pixels than the limits, and returns exactly 3 bytes a pixel.
func FuzzDecode(f *testing.F) {
	fuzzSeeds(f)
	lim := media.Limits{MaxPixels: 1 << 16, MaxSide: 1024}.WithDefaults()
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := media.DecodeRGB(data, lim)
		if err != nil {
			for _, e := range []error{media.ErrFormat, media.ErrMalformed, media.ErrTooLarge, media.ErrDecode} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("an error outside the sentinels: %v", err)
		}
		if d.Width <= 0 || d.Height <= 0 || d.Width > lim.MaxSide || d.Height > lim.MaxSide || int64(d.Width*d.Height) > lim.MaxPixels {
			t.Fatalf("decoded %dx%d past the limits", d.Width, d.Height)
		}
		if len(d.RGB) != d.Width*d.Height*3 {
			t.Fatalf("%d bytes for %dx%d", len(d.RGB), d.Width, d.Height)
		}
	})
}
