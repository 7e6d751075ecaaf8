package media

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	// maxChildStderr is how much of a dead child's stderr is kept for the error, in bytes.
	maxChildStderr = 512
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
	command func() *exec.Cmd
	timeout time.Duration
	memory  int64
	size    int
	lim     Limits
	custom  func() *exec.Cmd // WithDecoderCommand's, or nil

	idle      chan *decodeWorker // the workers not decoding; a decode takes one and gives it back
	done      chan struct{}      // closed by Close
	closeOnce sync.Once
	started   atomic.Int64 // children started: one per worker, and one more for each that died or was killed
}

type decodeWorker struct {
	proc *decodeProc // nil until the first decode, and after the child died
}

type decodeProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *os.File
	rd     *bufio.Reader
	stderr *headBuffer
}

// DecoderOption configures a Decoder.
type DecoderOption func(*Decoder)

// WithDecodeTimeout sets the most one decode may take.
func WithDecodeTimeout(d time.Duration) DecoderOption { return func(s *Decoder) { s.timeout = d } }

// WithDecoderMemory sets the child's data-segment limit in bytes.
func WithDecoderMemory(n int64) DecoderOption { return func(s *Decoder) { s.memory = n } }

// WithDecodeWorkers sets how many children decode at once (at least 1).
func WithDecodeWorkers(n int) DecoderOption { return func(s *Decoder) { s.size = max(n, 1) } }

// WithDecodeLimits sets the pixel limits the child checks again before it decodes (the defaults otherwise).
func WithDecodeLimits(l Limits) DecoderOption { return func(s *Decoder) { s.lim = l.WithDefaults() } }

// WithDecoderCommand sets the command that starts a child (default: this executable), for a process whose
// executable does not serve as the child, such as a test of another binary that does. The Decoder adds DecoderEnv
// to the command's environment (the process's own when it has none) and asks that the child die with its parent.
func WithDecoderCommand(command func() *exec.Cmd) DecoderOption {
	return func(s *Decoder) { s.custom = command }
}

// NewDecoder returns a Decoder whose children are this executable (os.Executable) with DecoderEnv set. A child
// starts on its first decode.
func NewDecoder(opts ...DecoderOption) *Decoder {
	s := &Decoder{timeout: DefaultDecodeTimeout, memory: DefaultDecoderMemory, size: DefaultDecodeWorkers,
		lim: Limits{}.WithDefaults(), done: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	s.idle = make(chan *decodeWorker, s.size)
	for range s.size {
		s.idle <- &decodeWorker{}
	}
	s.command = func() *exec.Cmd {
		var cmd *exec.Cmd
		if s.custom != nil {
			cmd = s.custom()
		} else {
			exe, err := os.Executable()
			if err != nil {
				exe = os.Args[0]
			}
			cmd = exec.Command(exe)
		}
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, DecoderEnv+"="+strconv.FormatInt(s.memory, 10))
		// The child must not outlive the server, even one stuck in a decode when the server is killed.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	return s
}

var errClosedDecoder = errors.New("decode image: the decoder is closed")

// Decode decodes im's pixels in a child. A refusal of the image (it does not decode, it passes a limit, it killed
// the child or took too long) wraps ErrDecode or ErrTooLarge; a child that cannot start wraps ErrDecoder; a ctx
// that ends first returns ctx's error (the child decoding for it is ended).
func (s *Decoder) Decode(ctx context.Context, im *Image) (*Decoded, error) {
	var w *decodeWorker
	select {
	case <-s.done:
		return nil, errClosedDecoder
	case <-ctx.Done():
		return nil, ctx.Err()
	case w = <-s.idle:
	}
	defer func() { s.idle <- w }()
	select {
	case <-s.done: // closed while waiting: the worker goes back for Close to end
		return nil, errClosedDecoder
	default:
	}
	if err := ctx.Err(); err != nil { // ended while waiting: no child is started or spent for it
		return nil, err
	}
	deadline := time.Now().Add(s.timeout)
	if w.proc == nil {
		p, err := s.start()
		if err != nil {
			return nil, fmt.Errorf("%w: start a decoder: %v", ErrDecoder, err)
		}
		w.proc = p
	}
	p := w.proc
	if err := p.out.SetReadDeadline(deadline); err != nil {
		w.kill()
		return nil, fmt.Errorf("%w: %v", ErrDecoder, err)
	}
	// A ctx that ends makes the pending read fail at once; the child is then killed below. The worker goes back only
	// after that func has run or been stopped, so that it never moves the deadline of the worker's next decode.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = p.out.SetReadDeadline(time.Now())
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	// The pipe's buffer (64 KiB) is smaller than an image: write while the child reads.
	werr := make(chan error, 1)
	go func() { werr <- writeRequest(p.in, s.lim, im.Data) }()
	d, msg, err := readResponse(p.rd, s.lim)
	if err != nil {
		w.kill() // ends the writer too: its pipe closes
		<-werr
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("%w: decoding took longer than %v", ErrDecode, s.timeout)
		}
		why, _, _ := strings.Cut(p.stderr.String(), "\n") // a dying Go runtime's first line says why
		if why == "" {
			why = err.Error()
		}
		return nil, fmt.Errorf("%w: the decoder died: %s", ErrDecode, why)
	}
	// The child reads a whole request before it answers, so the write has ended; one that failed leaves the child
	// out of step with this side, and it is ended.
	if err := <-werr; err != nil {
		w.kill()
		if msg == nil {
			return nil, fmt.Errorf("%w: send the image to the decoder: %v", ErrDecoder, err)
		}
	}
	if msg != nil {
		return nil, msg
	}
	d.Hash = im.Hash
	return d, nil
}

func (s *Decoder) start() (*decodeProc, error) {
	cmd := s.command()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	stderr := &headBuffer{max: maxChildStderr}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close() // the child holds its own copy; EOF on r means it exited
	s.started.Add(1)
	return &decodeProc{cmd: cmd, in: in, out: r, rd: bufio.NewReaderSize(r, 1<<16), stderr: stderr}, nil
}

// kill ends the worker's child, if any, and waits for it. The caller holds the worker.
func (w *decodeWorker) kill() {
	p := w.proc
	if p == nil {
		return
	}
	w.proc = nil
	_ = p.cmd.Process.Kill()
	p.in.Close()
	_ = p.cmd.Wait()
	p.out.Close()
}

// Close ends the children, after the decodes in progress (each bounded by the time limit). Decodes after Close
// fail.
func (s *Decoder) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		for range s.size {
			w := <-s.idle
			w.kill()
		}
	})
	return nil
}

// headBuffer keeps the first max bytes written to it (a dying Go runtime's first lines say why).
type headBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
	max int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *headBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}

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
