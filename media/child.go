package media

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"os"

	"golang.org/x/image/webp"

	"github.com/parley-chat/parley/internal/sandbox"
)

// ServeDecoder is the child's side: it limits this process (its data segment to DecoderEnv's value, one thread),
// then decodes the requests read from r, answering each on w, until r ends. It returns the process's exit status.
func ServeDecoder(getenv func(string) string, r io.Reader, w io.Writer) int {
	if err := sandbox.Confine(getenv(DecoderEnv)); err != nil {
		fmt.Fprintln(os.Stderr, "image decoder:", err)
		return 1
	}
	rd := bufio.NewReaderSize(r, 1<<16)
	bw := bufio.NewWriterSize(w, 1<<16)
	for {
		var hdr [16]byte
		if _, err := io.ReadFull(rd, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintln(os.Stderr, "image decoder: read request:", err)
			return 1
		}
		lim := Limits{MaxPixels: int64(binary.BigEndian.Uint64(hdr[0:])), MaxSide: int(binary.BigEndian.Uint32(hdr[8:]))}.WithDefaults()
		data := make([]byte, binary.BigEndian.Uint32(hdr[12:]))
		if _, err := io.ReadFull(rd, data); err != nil {
			fmt.Fprintln(os.Stderr, "image decoder: read request:", err)
			return 1
		}
		d, err := decodeRGB(data, lim)
		data = nil
		if err := writeResponse(bw, d, err); err != nil {
			return 1
		}
		d = nil
	}
}

func writeResponse(w *bufio.Writer, d *Decoded, derr error) error {
	var hdr [13]byte
	payload := []byte(nil)
	if derr != nil {
		hdr[0] = statusDecode
		switch {
		case errors.Is(derr, ErrTooLarge):
			hdr[0] = statusTooLarge
		case errors.Is(derr, ErrFormat):
			hdr[0] = statusFormat
		}
		msg := derr.Error()
		for _, e := range []error{ErrDecode, ErrTooLarge, ErrFormat, ErrMalformed} {
			// The parent wraps the message in the status's sentinel again.
			if p := e.Error() + ": "; len(msg) > len(p) && msg[:len(p)] == p {
				msg = msg[len(p):]
				break
			}
		}
		payload = []byte(msg[:min(len(msg), maxErrorMessage)])
	} else {
		binary.BigEndian.PutUint32(hdr[1:], uint32(d.Width))
		binary.BigEndian.PutUint32(hdr[5:], uint32(d.Height))
		payload = d.RGB
	}
	binary.BigEndian.PutUint32(hdr[9:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	return w.Flush()
}

// decodeRGB checks data's header against lim, decodes it with its format's decoder and returns its pixels as
// RGB.
func decodeRGB(data []byte, lim Limits) (*Decoded, error) {
	h, err := ReadHeader(data)
	if err != nil {
		return nil, err
	}
	if err := lim.checkSize(h.Width, h.Height); err != nil {
		return nil, err
	}
	img, err := decodeImage(h.Format, data)
	if err != nil {
		return nil, err
	}
	b := img.Bounds()
	if err := lim.checkSize(b.Dx(), b.Dy()); err != nil {
		return nil, err
	}
	return &Decoded{Width: b.Dx(), Height: b.Dy(), RGB: toRGB(img)}, nil
}

// decodeImage runs f's decoder on data. A decoder's panic is a refusal of the image, not the end of the child.
func decodeImage(f Format, data []byte) (img image.Image, err error) {
	defer func() {
		if p := recover(); p != nil {
			img, err = nil, fmt.Errorf("%w: %s: the decoder failed: %v", ErrDecode, f, p)
		}
	}()
	r := bytes.NewReader(data)
	switch f {
	case PNG:
		img, err = png.Decode(r)
	case JPEG:
		img, err = jpeg.Decode(r)
	case GIF:
		img, err = gif.Decode(r)
	case WebP:
		img, err = webp.Decode(r)
	default:
		return nil, fmt.Errorf("%w: %s", ErrFormat, f)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrDecode, f, err)
	}
	return img, nil
}

// toRGB returns img's pixels as 8-bit RGB rows without padding. Alpha is dropped without compositing, and 16-bit
// samples keep their high byte, as stb_image does (llama.cpp's tools read images with it). The common layouts
// have fast paths; any other goes through color.NRGBAModel.
func toRGB(img image.Image) []byte {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	out := make([]byte, 0, w*h*3)
	switch m := img.(type) {
	case *image.NRGBA:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, y):][:w*4]
			for i := 0; i < len(row); i += 4 {
				out = append(out, row[i], row[i+1], row[i+2])
			}
		}
		return out
	case *image.RGBA:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, y):][:w*4]
			for i := 0; i < len(row); i += 4 {
				if a := row[i+3]; a != 0xff {
					c := color.NRGBAModel.Convert(color.RGBA{row[i], row[i+1], row[i+2], a}).(color.NRGBA)
					out = append(out, c.R, c.G, c.B)
					continue
				}
				out = append(out, row[i], row[i+1], row[i+2])
			}
		}
		return out
	case *image.Gray:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for _, g := range m.Pix[m.PixOffset(b.Min.X, y):][:w] {
				out = append(out, g, g, g)
			}
		}
		return out
	case *image.YCbCr:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				yi, ci := m.YOffset(x, y), m.COffset(x, y)
				r, g, bl := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
				out = append(out, r, g, bl)
			}
		}
		return out
	case *image.Paletted:
		var pal [256][3]byte
		for i, c := range m.Palette {
			n := color.NRGBAModel.Convert(c).(color.NRGBA)
			pal[i] = [3]byte{n.R, n.G, n.B}
		}
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for _, p := range m.Pix[m.PixOffset(b.Min.X, y):][:w] {
				out = append(out, pal[p][0], pal[p][1], pal[p][2])
			}
		}
		return out
	}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			switch c := img.At(x, y).(type) {
			case color.NRGBA64:
				out = append(out, byte(c.R>>8), byte(c.G>>8), byte(c.B>>8))
			case color.RGBA64:
				if c.A == 0xffff {
					out = append(out, byte(c.R>>8), byte(c.G>>8), byte(c.B>>8))
					continue
				}
				n := color.NRGBA64Model.Convert(c).(color.NRGBA64)
				out = append(out, byte(n.R>>8), byte(n.G>>8), byte(n.B>>8))
			case color.Gray16:
				out = append(out, byte(c.Y>>8), byte(c.Y>>8), byte(c.Y>>8))
			default:
				n := color.NRGBAModel.Convert(c).(color.NRGBA)
				out = append(out, n.R, n.G, n.B)
			}
		}
	}
	return out
}
