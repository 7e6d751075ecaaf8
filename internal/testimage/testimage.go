// Package testimage makes images for tests.
package testimage

import (
	"bytes"
	"image"
	"image/png"
	"math/rand/v2"
	"testing"
)

// NoisePNG is a w x h opaque PNG of noise, which does not compress: about 3*w*h bytes. The same size gives the same
// bytes.
func NoisePNG(tb testing.TB, w, h int) []byte {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = byte(rng.Uint32())
		if i%4 == 3 {
			img.Pix[i] = 255
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}
