package media_test

import (
	"context"
	"image"
	"image/color"
	"testing"

	"github.com/parley-chat/parley/media"
)

// photo is a w x h image with smooth gradients and some noise-like detail, so that it compresses as a photo does
// rather than as a flat fill.
func photo(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, color.NRGBA{uint8(x * 255 / w), uint8(y * 255 / h), uint8((x*31 ^ y*17) & 0xff), 255})
		}
	}
	return img
}

// BenchmarkDecode measures one image's way through the sandboxed decoder (the pipe both ways included; the child
// is started before the timer): a 12-megapixel phone photo's size as JPEG, and a 1024x1024 PNG screenshot.
func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"jpeg-4032x3024", encodeJPEG(b, photo(4032, 3024))},
		{"png-1024x1024", encodePNG(b, photo(1024, 1024))},
	} {
		b.Run(c.name, func(b *testing.B) {
			d := media.NewDecoder(media.WithDecodeWorkers(1))
			defer d.Close()
			im, err := media.Limits{}.Check(c.data)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := d.Decode(context.Background(), im); err != nil { // starts the child
				b.Fatal(err)
			}
			b.SetBytes(int64(len(c.data)))
			b.ResetTimer()
			for range b.N {
				if _, err := d.Decode(context.Background(), im); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
