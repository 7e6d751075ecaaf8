package main

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/color"
	"image/png"
	"os/exec"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/media"
)

// The real binary serves as the image decoder's child (main checks media.DecoderChild first): it decodes an
// image, and refuses a bomb that passes no header check, without dying.
func TestBinaryIsTheImageDecoder(t *testing.T) {
	bin := testbin.Parley(t)
	d := media.NewDecoder(media.WithDecodeWorkers(1), media.WithDecoderCommand(func() *exec.Cmd { return exec.Command(bin) }))
	defer d.Close()
	img := image.NewNRGBA(image.Rect(0, 0, 3, 2))
	for i := range img.Pix {
		img.Pix[i] = byte(i * 9)
	}
	img.SetNRGBA(0, 0, color.NRGBA{1, 2, 3, 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	im, err := media.Limits{}.Check(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Decode(context.Background(), im)
	if err != nil {
		t.Fatal(err)
	}
	if got.Width != 3 || got.Height != 2 || !bytes.Equal(got.RGB[:3], []byte{1, 2, 3}) || len(got.RGB) != 18 {
		t.Errorf("decoded %dx%d %v", got.Width, got.Height, got.RGB)
	}
	// A header claiming 100000x100000 pixels, sent past the parent's check: the child refuses it itself.
	bomb := append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"), 0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0, 8, 2, 0, 0, 0, 0, 0, 0, 0)
	if _, err := d.Decode(context.Background(), &media.Image{Data: bomb}); !errors.Is(err, media.ErrTooLarge) {
		t.Errorf("a bomb: %v; want ErrTooLarge", err)
	}
	if _, err := d.Decode(context.Background(), im); err != nil {
		t.Errorf("after the bomb: %v", err)
	}
}
