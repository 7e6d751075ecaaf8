package media_test

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"testing"
)

// Test images, made here by Go's encoders (WebP has none: testdata holds two made by cwebp from the same 5x3
// pattern as pattern).

// pattern is a w x h image whose pixel (x, y) is (x*50, y*100, 200), opaque.
func pattern(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.NRGBA{uint8(x * 50), uint8(y * 100), 200, 255})
		}
	}
	return img
}

// patternRGB is pattern's pixels as RGB.
func patternRGB(w, h int) []byte {
	var out []byte
	for y := range h {
		for x := range w {
			out = append(out, uint8(x*50), uint8(y*100), 200)
		}
	}
	return out
}

func encodePNG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeGIF(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := gif.Encode(&b, img, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pngChunk is one PNG chunk with its CRC.
func pngChunk(typ string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(len(data)))
	b.WriteString(typ)
	b.Write(data)
	binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(typ), data...)))
	return b.Bytes()
}

// pngBomb is a well-formed PNG of w x h 8-bit grey pixels, all zero: its IDAT is a deflate stream of zeros, which
// compresses about a thousand to one, so a large bomb is a small file.
func pngBomb(t testing.TB, w, h int) []byte {
	t.Helper()
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8] = 8 // bit depth; color type 0 (grey), no interlace
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	row := make([]byte, w+1) // a filter byte, then the row
	for range h {
		zw.Write(row)
	}
	zw.Close()
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	b.Write(pngChunk("IHDR", ihdr[:]))
	b.Write(pngChunk("IDAT", z.Bytes()))
	b.Write(pngChunk("IEND", nil))
	return b.Bytes()
}

// pngHeaderOnly is a PNG signature and an IHDR for w x h, with no image data: a bomb's header.
func pngHeaderOnly(w, h uint32) []byte {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 2
	return append([]byte("\x89PNG\r\n\x1a\n"), pngChunk("IHDR", ihdr[:])...)
}
