package media

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/parley-chat/parley/internal/sandbox"
)

// Image decoders are large parsers of hostile input: a decoder bug, a decompression bomb that passes the header
// check (a frame larger than its header says) or a file built to be slow must never take the server down or hold
// it up. So a Decoder decodes in a child process (this same executable, started with DecoderEnv set) that limits
// its own data segment (RLIMIT_DATA, which bounds the Go heap) and runs on one thread, and the parent kills it when
// a decode takes longer than the time limit. A killed or dead child is restarted on the next decode; the decode
// that killed it fails with ErrDecode. A few children decode at once (DefaultDecodeWorkers). The protocol between
// them is binary (decoded pixels are megabytes): see writeRequest and readResponse.

// DecoderEnv is the environment variable that makes a process an image-decoding child: its main (or TestMain) must
// call ServeDecoder first thing when DecoderChild reports it. Its value is the child's memory limit in bytes.
const DecoderEnv = "PARLEY_IMAGE_SANDBOX"

// Decoder defaults.
const (
	// DefaultDecodeTimeout is the most one decode may take, start of the child included. A 16-megapixel
	// progressive JPEG decodes in well under a second; the limit only catches a file built to be slow.
	DefaultDecodeTimeout = 10 * time.Second
	// DefaultDecoderMemory is the child's data-segment limit (RLIMIT_DATA), in bytes: DefaultMaxPixels decode into
	// 64 MiB of RGBA and 48 MiB of RGB, beside the 20 MiB file and the Go runtime's 40 MiB.
	DefaultDecoderMemory = 1 << 30
	// DefaultDecodeWorkers is how many children decode at once.
	DefaultDecodeWorkers = 2
	// maxErrorMessage bounds an error message a child sends, in bytes.
	maxErrorMessage = 4096
)

// DecoderChild reports whether this process was started as an image-decoding child.
func DecoderChild(getenv func(string) string) bool { return getenv(DecoderEnv) != "" }

// Decoded is an image's pixels in the form the engine takes: 8-bit RGB, row by row from the top left, 3 bytes a
// pixel with no padding (llama.cpp's mtmd_bitmap). An alpha channel is dropped, as stb_image drops it (llama.cpp's
// own tools read images with stb_image), so that the same PNG gives the same pixels here as there.
type Decoded struct {
	Width, Height int
	RGB           []byte
	Hash          [32]byte // the encoded image's sha256 (Image.Hash)
}

// Decoder decodes images in child processes under limits. Safe for concurrent use; Close ends the children.
type Decoder struct {
	cfg  sandbox.Config
	lim  Limits
	pool *sandbox.Pool
}

// DecoderOption configures a Decoder.
type DecoderOption func(*Decoder)

// WithDecodeTimeout sets the most one decode may take.
func WithDecodeTimeout(d time.Duration) DecoderOption { return func(s *Decoder) { s.cfg.Timeout = d } }

// WithDecoderMemory sets the child's data-segment limit in bytes.
func WithDecoderMemory(n int64) DecoderOption { return func(s *Decoder) { s.cfg.Memory = n } }

// WithDecodeWorkers sets how many children decode at once (at least 1).
func WithDecodeWorkers(n int) DecoderOption { return func(s *Decoder) { s.cfg.Workers = max(n, 1) } }

// WithDecodeLimits sets the pixel limits the child checks again before it decodes (the defaults otherwise).
func WithDecodeLimits(l Limits) DecoderOption { return func(s *Decoder) { s.lim = l.WithDefaults() } }

// WithDecoderCommand sets the command that starts a child (default: this executable), for a process whose
// executable does not serve as the child, such as a test of another binary that does. The Decoder adds DecoderEnv
// to the command's environment (the process's own when it has none) and asks that the child die with its parent.
func WithDecoderCommand(command func() *exec.Cmd) DecoderOption {
	return func(s *Decoder) { s.cfg.Command = command }
}

// NewDecoder returns a Decoder whose children are this executable (os.Executable) with DecoderEnv set. A child
// starts on its first decode.
func NewDecoder(opts ...DecoderOption) *Decoder {
	s := &Decoder{cfg: sandbox.Config{Env: DecoderEnv, Timeout: DefaultDecodeTimeout, Memory: DefaultDecoderMemory,
		Workers: DefaultDecodeWorkers}, lim: Limits{}.WithDefaults()}
	for _, o := range opts {
		o(s)
	}
	s.pool = sandbox.New(s.cfg)
	return s
}

var errClosedDecoder = errors.New("decode image: the decoder is closed")

// Decode decodes im's pixels in a child. A refusal of the image (it does not decode, it passes a limit, it killed
// the child or took too long) wraps ErrDecode or ErrTooLarge; a child that cannot start wraps ErrDecoder; a ctx
// that ends first returns ctx's error (the child decoding for it is ended).
func (s *Decoder) Decode(ctx context.Context, im *Image) (*Decoded, error) {
	var (
		d   *Decoded
		msg error // the child's refusal of the image
	)
	err := s.pool.Exchange(ctx,
		func(w io.Writer) error { return writeRequest(w, s.lim, im.Data) },
		func(r *bufio.Reader) (err error) {
			d, msg, err = readResponse(r, s.lim)
			return err
		})
	var start *sandbox.StartError
	var died *sandbox.ChildError
	switch {
	case err == nil:
	case errors.Is(err, sandbox.ErrClosed):
		return nil, errClosedDecoder
	case err == ctx.Err(): // ended first
		return nil, err
	case errors.As(err, &start):
		return nil, fmt.Errorf("%w: start a decoder: %v", ErrDecoder, start.Err)
	case errors.Is(err, sandbox.ErrTimeout):
		return nil, fmt.Errorf("%w: decoding took longer than %v", ErrDecode, s.cfg.Timeout)
	case errors.As(err, &died) && died.Op == sandbox.OpSend:
		// The answer came, but the request's write failed: the child was ended, and a refusal still stands.
		if msg == nil {
			return nil, fmt.Errorf("%w: send the image to the decoder: %v", ErrDecoder, died.Err)
		}
	case errors.As(err, &died):
		why := died.Stderr
		if why == "" {
			why = died.Err.Error()
		}
		return nil, fmt.Errorf("%w: the decoder died: %s", ErrDecode, why)
	default:
		return nil, fmt.Errorf("%w: %v", ErrDecoder, err)
	}
	if msg != nil {
		return nil, msg
	}
	d.Hash = im.Hash
	return d, nil
}

// Close ends the children, after the decodes in progress (each bounded by the time limit). Decodes after Close
// fail.
func (s *Decoder) Close() error { return s.pool.Close() }

// The protocol. A request is the limits (max pixels: 8 bytes, max side: 4 bytes), the file's length (4 bytes) and
// the file, all big-endian. A response is a status byte, width and height (4 bytes each) and a length (4 bytes),
// then that many bytes: the RGB pixels (status OK: exactly width*height*3) or an error message.
const (
	statusOK       = 0
	statusDecode   = 1 // the image does not decode (ErrDecode)
	statusTooLarge = 2 // the image passes a limit (ErrTooLarge)
	statusFormat   = 3 // the image is not an accepted format (ErrFormat)
)

func writeRequest(w io.Writer, lim Limits, data []byte) error {
	var hdr [16]byte
	binary.BigEndian.PutUint64(hdr[0:], uint64(lim.MaxPixels))
	binary.BigEndian.PutUint32(hdr[8:], uint32(lim.MaxSide))
	binary.BigEndian.PutUint32(hdr[12:], uint32(len(data)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(data)
	return err
}

// readResponse reads one response. It returns the pixels, or the child's refusal as msg, or err when the
// response is not readable (the child died, the deadline passed) or not well formed.
func readResponse(r io.Reader, lim Limits) (d *Decoded, msg error, err error) {
	var hdr [13]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, nil, err
	}
	status := hdr[0]
	w, h := int(binary.BigEndian.Uint32(hdr[1:])), int(binary.BigEndian.Uint32(hdr[5:]))
	n := int64(binary.BigEndian.Uint32(hdr[9:]))
	if status != statusOK {
		if n > maxErrorMessage {
			return nil, nil, fmt.Errorf("an error message of %d bytes", n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, nil, err
		}
		sentinel := ErrDecode
		switch status {
		case statusTooLarge:
			sentinel = ErrTooLarge
		case statusFormat:
			sentinel = ErrFormat
		}
		return nil, fmt.Errorf("%w: %s", sentinel, b), nil
	}
	if w <= 0 || h <= 0 || w > lim.MaxSide || h > lim.MaxSide || int64(w)*int64(h) > lim.MaxPixels || n != int64(w)*int64(h)*3 {
		return nil, nil, fmt.Errorf("a response of %dx%d pixels in %d bytes", w, h, n)
	}
	rgb := make([]byte, n)
	if _, err := io.ReadFull(r, rgb); err != nil {
		return nil, nil, err
	}
	return &Decoded{Width: w, Height: h, RGB: rgb}, nil, nil
}

// PNM is d's pixels as a binary PPM (P6, 8-bit), for an engine binding that takes encoded bytes only (the embedded
// engine's mtmd helper reads them with stb_image, which reads this format exactly): the bytes it parses are then
// this package's own, never the client's file.
func (d *Decoded) PNM() []byte {
	hdr := fmt.Sprintf("P6\n%d %d\n255\n", d.Width, d.Height)
	out := make([]byte, 0, len(hdr)+len(d.RGB))
	return append(append(out, hdr...), d.RGB...)
}
