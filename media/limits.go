package media

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The errors an image is refused with. Each is a client's fault (an HTTP 400), except ErrDecoder (the decoding
// child could not be started: a 500) and ErrBusy (a 503); ErrRemoteOff and ErrRemote are about a URL.
var (
	ErrFormat    = errors.New("unsupported image format")
	ErrMalformed = errors.New("malformed image")
	ErrTooLarge  = errors.New("image too large")
	ErrTooMany   = errors.New("too many images")
	ErrEncoding  = errors.New("bad image encoding")
	ErrDecode    = errors.New("image does not decode")
	ErrDecoder   = errors.New("image decoder unavailable")
	ErrRemoteOff = errors.New("remote image URLs are off")
	ErrRemote    = errors.New("remote image refused")
)

// Limit defaults.
const (
	// DefaultMaxBytes is the most bytes one encoded image may have (OpenAI's limit for an image input).
	DefaultMaxBytes = 20 << 20
	// DefaultMaxPixels is the most pixels one image may have: 4096x4096, above a 12-megapixel phone photo. A vision
	// projector resizes to about a megapixel or less, so more buys nothing; its RGB is 48 MiB.
	DefaultMaxPixels = 4096 * 4096
	// DefaultMaxSide is the most pixels one side may have (a long screenshot is tall and narrow).
	DefaultMaxSide = 16384
	// DefaultMaxImages is the most images one request may carry.
	DefaultMaxImages = 16
	// DefaultMaxConversationImages is the most images one stored conversation may keep.
	DefaultMaxConversationImages = 64
	// DefaultMaxConversationBytesCap caps the default of Limits.MaxConversationBytes: 64 MiB of images, a dozen
	// phone photos or many screenshots, about 85 MiB of a stored record (its images in base64), under the 100 MiB
	// one client may hold of the session store's default budget.
	DefaultMaxConversationBytesCap = 64 << 20
)

// Limits bound what one image, and one request's images, may be. The zero value of a field means its default.
type Limits struct {
	MaxBytes              int64    // encoded bytes per image
	MaxPixels             int64    // width*height per image
	MaxSide               int      // pixels per side
	MaxImages             int      // images per request
	MaxConversationImages int      // images per stored conversation (for the store; Batch does not see it)
	Formats               []Format // accepted formats (default AllFormats)
	// MaxConversationBytes is the bytes of the images one stored conversation may keep, each image's once (for the
	// store). Its default is MaxConversationImages images of MaxBytes, capped at DefaultMaxConversationBytesCap but
	// never below MaxBytes, so one image of the largest size is always kept.
	MaxConversationBytes int64
}

// dataURLHeader is room for a data: URL's header ("data:image/jpeg;base64,", parameters included) and the JSON
// around one image, in bytes.
const dataURLHeader = 128

// MaxSourceBytes is the most bytes the images of one request may take as the request carries them: MaxImages
// images of MaxBytes each, as base64 data: URLs (4 characters for every 3 bytes). A socket message may take this
// much more than a message without images.
func (l Limits) MaxSourceBytes() int64 {
	l = l.WithDefaults()
	return int64(l.MaxImages) * ((l.MaxBytes+2)/3*4 + dataURLHeader)
}

// WithDefaults returns l with each zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxPixels <= 0 {
		l.MaxPixels = DefaultMaxPixels
	}
	if l.MaxSide <= 0 {
		l.MaxSide = DefaultMaxSide
	}
	if l.MaxImages <= 0 {
		l.MaxImages = DefaultMaxImages
	}
	if l.MaxConversationImages <= 0 {
		l.MaxConversationImages = DefaultMaxConversationImages
	}
	if l.MaxConversationBytes <= 0 {
		l.MaxConversationBytes = max(min(int64(l.MaxConversationImages)*l.MaxBytes, DefaultMaxConversationBytesCap), l.MaxBytes)
	}
	if len(l.Formats) == 0 {
		l.Formats = AllFormats
	}
	return l
}

// Image is an accepted image: its encoded bytes as the client sent them, what its header says, and its content
// hash. It has not been decoded yet (Decoder.Decode does that, in the child).
type Image struct {
	Header
	Data []byte
	Hash [32]byte // sha256 of Data
}

// MediaType is the image's media type by its magic number (never by what the client declared).
func (im *Image) MediaType() string { return im.Format.MediaType() }

// Check accepts data as an image under l's limits, from its header alone: its size in bytes, its format, and its
// width and height, before any pixel is decoded. A refusal wraps ErrTooLarge, ErrFormat or ErrMalformed.
func (l Limits) Check(data []byte) (*Image, error) {
	l = l.WithDefaults()
	if int64(len(data)) > l.MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, len(data), l.MaxBytes)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: no bytes", ErrMalformed)
	}
	h, err := ReadHeader(data)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(l.Formats, h.Format) {
		return nil, fmt.Errorf("%w: %s images are not accepted here (%s are)", ErrFormat, strings.ToUpper(string(h.Format)), formatList(l.Formats))
	}
	if err := l.checkSize(h.Width, h.Height); err != nil {
		return nil, err
	}
	return &Image{Header: h, Data: data, Hash: sha256.Sum256(data)}, nil
}

// checkSize refuses a width and height past the limits (l has its defaults).
func (l Limits) checkSize(w, h int) error {
	if w > l.MaxSide || h > l.MaxSide {
		return fmt.Errorf("%w: %dx%d pixels, a side longer than %d", ErrTooLarge, w, h, l.MaxSide)
	}
	if int64(w)*int64(h) > l.MaxPixels {
		return fmt.Errorf("%w: %dx%d pixels, more than %d in all", ErrTooLarge, w, h, l.MaxPixels)
	}
	return nil
}

func formatList(fs []Format) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = strings.ToUpper(string(f))
	}
	return strings.Join(names, ", ")
}

// Intake accepts one image given as a request gives it: a data: URL or bare base64 (ParseSource), checked by
// Check. A remote URL is refused with ErrRemoteOff; a caller with a Fetcher fetches it and calls Check itself.
func (l Limits) Intake(src string) (*Image, error) {
	l = l.WithDefaults()
	data, err := ParseSource(src, l.MaxBytes)
	if err != nil {
		return nil, err
	}
	return l.Check(data)
}

// PartError is a refused image with the request part it came from ("messages[1].content[2]"), so that the client
// hears which part was refused. errors.Is sees through it to the reason.
type PartError struct {
	Part string
	Err  error
}

func (e *PartError) Error() string { return e.Part + ": " + e.Err.Error() }
func (e *PartError) Unwrap() error { return e.Err }

// Batch takes the images of one request in order, counting them against MaxImages; each refusal is a *PartError.
// A Batch is used by one request's goroutine.
type Batch struct {
	lim    Limits
	images []*Image
}

// NewBatch starts a request's images under l.
func (l Limits) NewBatch() *Batch { return &Batch{lim: l.WithDefaults()} }

// Add accepts the image src (a data: URL or bare base64) of the request part named part.
func (b *Batch) Add(part, src string) (*Image, error) {
	if len(b.images) >= b.lim.MaxImages {
		return nil, &PartError{part, fmt.Errorf("%w: more than %d in one request", ErrTooMany, b.lim.MaxImages)}
	}
	im, err := b.lim.Intake(src)
	if err != nil {
		return nil, &PartError{part, err}
	}
	b.images = append(b.images, im)
	return im, nil
}

// AddBytes accepts already-decoded bytes (an Anthropic base64 source after its own decoding, a fetched URL's
// body) as the image of the request part named part.
func (b *Batch) AddBytes(part string, data []byte) (*Image, error) {
	if len(b.images) >= b.lim.MaxImages {
		return nil, &PartError{part, fmt.Errorf("%w: more than %d in one request", ErrTooMany, b.lim.MaxImages)}
	}
	im, err := b.lim.Check(data)
	if err != nil {
		return nil, &PartError{part, err}
	}
	b.images = append(b.images, im)
	return im, nil
}

// Images are the images accepted so far, in request order.
func (b *Batch) Images() []*Image { return b.images }
