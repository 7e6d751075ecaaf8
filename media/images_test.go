package media_test

import (
	"bytes"
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

// pngBomb is a well-formed PNG of w x h 8-bit grey pixels, all zero, whose image data is a zlib stream of zeros
// (zeroZlib): about 13 bits for each 258 bytes, so a large bomb is a small file, made at once.
func pngBomb(t testing.TB, w, h int) []byte {
	t.Helper()
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8] = 8 // bit depth; color type 0 (grey), no interlace
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	b.Write(pngChunk("IHDR", ihdr[:]))
	b.Write(pngChunk("IDAT", zeroZlib((w+1)*h))) // each row is a filter byte (0, none) and w zero pixels
	b.Write(pngChunk("IEND", nil))
	return b.Bytes()
}

// zeroZlib is a zlib stream of n zero bytes, written by hand: one fixed-Huffman deflate block of a literal 0 and
// then matches of length 258 at distance 1 (RFC 1951, 3.2.6), zeros as literals for the rest; the Adler-32 of n
// zeros is n<<16 | 1 (mod 65521).
func zeroZlib(n int) []byte {
	out := []byte{0x78, 0x01}
	var acc uint64
	var bits uint
	put := func(v uint64, nb uint) { // LSB first
		acc |= v << bits
		bits += nb
		for bits >= 8 {
			out = append(out, byte(acc))
			acc >>= 8
			bits -= 8
		}
	}
	code := func(c uint64, nb uint) { // a Huffman code, most significant bit first
		var r uint64
		for i := uint(0); i < nb; i++ {
			r = r<<1 | (c>>i)&1
		}
		put(r, nb)
	}
	put(1, 1) // BFINAL
	put(1, 2) // BTYPE 01: fixed Huffman
	left := n
	if left > 0 {
		code(0x30, 8) // literal 0
		left--
	}
	for left >= 258 {
		code(0xc5, 8) // length 258 (symbol 285)
		code(0, 5)    // distance 1 (code 0)
		left -= 258
	}
	for ; left > 0; left-- {
		code(0x30, 8)
	}
	code(0, 7) // end of block (256)
	if bits > 0 {
		put(0, 8-bits)
	}
	return binary.BigEndian.AppendUint32(out, uint32(n%65521)<<16|1)
}

// pngHeaderOnly is a PNG signature and an IHDR for w x h, with no image data: a bomb's header.
func pngHeaderOnly(w, h uint32) []byte {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 2
	return append([]byte("\x89PNG\r\n\x1a\n"), pngChunk("IHDR", ihdr[:])...)
}
