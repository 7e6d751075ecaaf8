package media

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Format is an image format, named as in a media type's subtype (image/png is PNG).
type Format string

// The formats that decode. Each has a decoder in Go's standard library or golang.org/x/image, which the decoding
// child runs.
const (
	PNG  Format = "png"
	JPEG Format = "jpeg"
	WebP Format = "webp"
	GIF  Format = "gif"
)

// AllFormats are the formats that decode, the default of Limits.Formats.
var AllFormats = []Format{PNG, JPEG, WebP, GIF}

// MediaType is the format's media type (image/png).
func (f Format) MediaType() string { return "image/" + string(f) }

// Header is what an image's header says, read without decoding a pixel.
type Header struct {
	Format        Format
	Width, Height int
}

// Pixels is Width*Height.
func (h Header) Pixels() int64 { return int64(h.Width) * int64(h.Height) }

// refused are formats recognized by their magic only to be refused by name: a client that sends one hears which
// format it sent, not "unknown". Each entry is a prefix at offset 0 unless at says otherwise.
var refused = []struct {
	name  string
	magic string
	at    int
}{
	{"BMP", "BM", 0},
	{"TIFF", "II*\x00", 0},
	{"TIFF", "MM\x00*", 0},
	{"ICO", "\x00\x00\x01\x00", 0},
	{"Photoshop (PSD)", "8BPS", 0},
	{"JPEG XL", "\xff\x0a", 0},
	{"JPEG XL", "\x00\x00\x00\x0cJXL \r\n\x87\n", 0},
	{"JPEG 2000", "\x00\x00\x00\x0cjP  \r\n\x87\n", 0},
	{"QOI", "qoif", 0},
	{"PDF", "%PDF", 0},
	{"HEIC", "ftypheic", 4},
	{"HEIC", "ftypheix", 4},
	{"HEIC", "ftyphevc", 4},
	{"HEIC", "ftypmif1", 4},
	{"HEIC", "ftypmsf1", 4},
	{"AVIF", "ftypavif", 4},
	{"AVIF", "ftypavis", 4},
}

// Sniff names data's format by its magic number: one of the formats that decode, or an error (ErrFormat) that
// names the refused format when it is a known one.
func Sniff(data []byte) (Format, error) {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return PNG, nil
	case bytes.HasPrefix(data, []byte("\xff\xd8\xff")):
		return JPEG, nil
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return WebP, nil
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		return GIF, nil
	}
	for _, r := range refused {
		if len(data) >= r.at+len(r.magic) && string(data[r.at:r.at+len(r.magic)]) == r.magic {
			return "", fmt.Errorf("%w: %s images are not accepted", ErrFormat, r.name)
		}
	}
	if svgLike(data) {
		return "", fmt.Errorf("%w: SVG images are not accepted", ErrFormat)
	}
	if len(data) >= 12 && string(data[4:8]) == "ftyp" {
		return "", fmt.Errorf("%w: an ISO media file (brand %q) is not an accepted image", ErrFormat, printable(data[8:12]))
	}
	return "", fmt.Errorf("%w: not a PNG, JPEG, WebP or GIF image (it starts %q)", ErrFormat, printable(data[:min(len(data), 8)]))
}

// svgLike reports whether data looks like XML or SVG text: a byte-order mark and white space, then <svg or <?xml.
func svgLike(data []byte) bool {
	data = bytes.TrimPrefix(data[:min(len(data), 512)], []byte("\xef\xbb\xbf"))
	data = bytes.TrimLeft(data, " \t\r\n")
	return bytes.HasPrefix(data, []byte("<svg")) || bytes.HasPrefix(data, []byte("<?xml")) || bytes.HasPrefix(data, []byte("<!DOCTYPE svg"))
}

// printable replaces the bytes of b that are not printable ASCII with '.', for an error message.
func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '.'
		}
		out[i] = c
	}
	return string(out)
}

// ReadHeader sniffs data's format and reads its width and height from the header alone. It reads only the bytes
// the header spans, allocates nothing in proportion to the image, and fails with ErrMalformed on a header that is
// truncated or inconsistent, or that the decoder would refuse (an arithmetic-coded or lossless JPEG, an animated
// WebP). A GIF's size is the larger of its logical screen and its first frame's extent.
func ReadHeader(data []byte) (Header, error) {
	f, err := Sniff(data)
	if err != nil {
		return Header{}, err
	}
	h := Header{Format: f}
	switch f {
	case PNG:
		h.Width, h.Height, err = pngSize(data)
	case JPEG:
		h.Width, h.Height, err = jpegSize(data)
	case WebP:
		h.Width, h.Height, err = webpSize(data)
	case GIF:
		h.Width, h.Height, err = gifSize(data)
	}
	if err != nil {
		return Header{}, fmt.Errorf("%w: %s: %v", ErrMalformed, f, err)
	}
	if h.Width <= 0 || h.Height <= 0 {
		return Header{}, fmt.Errorf("%w: %s: the header says %dx%d pixels", ErrMalformed, f, h.Width, h.Height)
	}
	return h, nil
}

var errTruncated = fmt.Errorf("the header is cut short")

// pngSize reads the IHDR chunk, which a PNG must start with.
func pngSize(data []byte) (int, int, error) {
	if len(data) < 8+8+13 {
		return 0, 0, errTruncated
	}
	chunk := data[8:]
	if binary.BigEndian.Uint32(chunk) != 13 || string(chunk[4:8]) != "IHDR" {
		return 0, 0, fmt.Errorf("the first chunk is not IHDR")
	}
	w, h := binary.BigEndian.Uint32(chunk[8:]), binary.BigEndian.Uint32(chunk[12:])
	if w > 1<<31-1 || h > 1<<31-1 {
		return 0, 0, fmt.Errorf("the header says %dx%d pixels", w, h)
	}
	return int(w), int(h), nil
}

// jpegSize walks the markers to the frame header (SOF). Go's decoder reads baseline and progressive Huffman
// JPEGs (SOF0, SOF1, SOF2) only; the other frame types are refused here by name.
func jpegSize(data []byte) (int, int, error) {
	i := 2 // after SOI
	for {
		// A marker is 0xff, any number of fill bytes 0xff, then the marker's code.
		if i >= len(data) {
			return 0, 0, errTruncated
		}
		if data[i] != 0xff {
			return 0, 0, fmt.Errorf("no marker at byte %d", i)
		}
		for i < len(data) && data[i] == 0xff {
			i++
		}
		if i >= len(data) {
			return 0, 0, errTruncated
		}
		m := data[i]
		i++
		switch {
		case m == 0x01 || (m >= 0xd0 && m <= 0xd7): // TEM, RSTn: no length
			continue
		case m == 0xd9 || m == 0xda: // EOI, SOS before any frame header
			return 0, 0, fmt.Errorf("no frame header before the image data")
		}
		if i+2 > len(data) {
			return 0, 0, errTruncated
		}
		n := int(binary.BigEndian.Uint16(data[i:]))
		if n < 2 {
			return 0, 0, fmt.Errorf("marker %#x has length %d", m, n)
		}
		switch m {
		case 0xc0, 0xc1, 0xc2: // baseline, extended sequential, progressive (Huffman)
			if n < 8 || i+8 > len(data) {
				return 0, 0, errTruncated
			}
			h, w := int(binary.BigEndian.Uint16(data[i+3:])), int(binary.BigEndian.Uint16(data[i+5:]))
			if h == 0 {
				return 0, 0, fmt.Errorf("the height is given later (DNL), which is not supported")
			}
			return w, h, nil
		case 0xc3, 0xc7, 0xcb, 0xcf:
			return 0, 0, fmt.Errorf("lossless JPEG is not supported")
		case 0xc5, 0xc6, 0xcd, 0xce:
			return 0, 0, fmt.Errorf("hierarchical JPEG is not supported")
		case 0xc9, 0xca:
			return 0, 0, fmt.Errorf("arithmetic-coded JPEG is not supported")
		}
		i += n
	}
}

// webpSize reads the first chunk: VP8 (lossy), VP8L (lossless) or VP8X (extended; refused when animated, which
// the decoder does not read).
func webpSize(data []byte) (int, int, error) {
	if len(data) < 20 {
		return 0, 0, errTruncated
	}
	payload := data[20:]
	switch string(data[12:16]) {
	case "VP8 ":
		// A frame tag (3 bytes), the start code 9d 01 2a, then 14-bit width and height with 2 bits of scale each.
		if len(payload) < 10 {
			return 0, 0, errTruncated
		}
		if payload[0]&1 != 0 {
			return 0, 0, fmt.Errorf("the first VP8 frame is not a key frame")
		}
		if payload[3] != 0x9d || payload[4] != 0x01 || payload[5] != 0x2a {
			return 0, 0, fmt.Errorf("no VP8 start code")
		}
		return int(binary.LittleEndian.Uint16(payload[6:]) & 0x3fff), int(binary.LittleEndian.Uint16(payload[8:]) & 0x3fff), nil
	case "VP8L":
		// The signature 0x2f, then width-1 and height-1 in 14 bits each, least significant bit first.
		if len(payload) < 5 {
			return 0, 0, errTruncated
		}
		if payload[0] != 0x2f {
			return 0, 0, fmt.Errorf("no VP8L signature")
		}
		bits := binary.LittleEndian.Uint32(payload[1:])
		return int(bits&0x3fff) + 1, int(bits>>14&0x3fff) + 1, nil
	case "VP8X":
		// Flags (1 byte; 0x02 is animation), 3 reserved bytes, then canvas width-1 and height-1 in 24 bits each.
		if len(payload) < 10 {
			return 0, 0, errTruncated
		}
		if payload[0]&0x02 != 0 {
			return 0, 0, fmt.Errorf("animated WebP is not supported")
		}
		u24 := func(b []byte) int { return int(b[0]) | int(b[1])<<8 | int(b[2])<<16 }
		return u24(payload[4:]) + 1, u24(payload[7:]) + 1, nil
	}
	return 0, 0, fmt.Errorf("unknown first chunk %q", printable(data[12:16]))
}

// gifSize reads the logical screen, then walks the blocks to the first image descriptor: a frame may extend past
// the logical screen, and the decoder allocates the frame.
func gifSize(data []byte) (int, int, error) {
	if len(data) < 13 {
		return 0, 0, errTruncated
	}
	w, h := int(binary.LittleEndian.Uint16(data[6:])), int(binary.LittleEndian.Uint16(data[8:]))
	i := 13
	if flags := data[10]; flags&0x80 != 0 { // a global color table of 2^(n+1) entries
		i += 3 << (flags&7 + 1)
	}
	for {
		if i >= len(data) {
			return 0, 0, errTruncated
		}
		switch data[i] {
		case 0x21: // an extension: label, then sub-blocks ended by a zero-length one
			i += 2
			for {
				if i >= len(data) {
					return 0, 0, errTruncated
				}
				n := int(data[i])
				i += 1 + n
				if n == 0 {
					break
				}
			}
		case 0x2c: // the first image descriptor: left, top, width, height
			if i+9 > len(data) {
				return 0, 0, errTruncated
			}
			d := data[i+1:]
			left, top := int(binary.LittleEndian.Uint16(d)), int(binary.LittleEndian.Uint16(d[2:]))
			fw, fh := int(binary.LittleEndian.Uint16(d[4:])), int(binary.LittleEndian.Uint16(d[6:]))
			return max(w, left+fw), max(h, top+fh), nil
		case 0x3b:
			return 0, 0, fmt.Errorf("no image before the trailer")
		default:
			return 0, 0, fmt.Errorf("unknown block %#x at byte %d", data[i], i)
		}
	}
}
