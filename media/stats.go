package media

import (
	"errors"
	"sync/atomic"
	"time"
)

// Refusal reasons, as /metrics labels them: each names the sentinel error an image was refused with, or the layer
// that refused it.
const (
	ReasonFormat    = "format"     // ErrFormat: a format not accepted, or not an image
	ReasonMalformed = "malformed"  // ErrMalformed: a header that does not parse
	ReasonTooLarge  = "too_large"  // ErrTooLarge: bytes, pixels or a side over the limits
	ReasonTooMany   = "too_many"   // ErrTooMany: more images than a request may carry
	ReasonEncoding  = "encoding"   // ErrEncoding: bad base64, a data: URL that is not base64
	ReasonDecode    = "decode"     // ErrDecode: the pixels do not decode (in the child, or it died or took too long)
	ReasonDecoder   = "decoder"    // ErrDecoder: no decoding child could start (the server's fault)
	ReasonRemoteOff = "remote_off" // ErrRemoteOff: an http(s) URL where remote URLs are off
	ReasonRemote    = "remote"     // ErrRemote: a remote URL refused (host, address, redirect, status, time)
	ReasonNoVision  = "no_vision"  // a model without a projector, or a server that decodes no images
	ReasonOther     = "other"      // none of these
)

// Reasons are every refusal reason, in a fixed order (the series /metrics starts at zero).
var reasons = [...]string{ReasonFormat, ReasonMalformed, ReasonTooLarge, ReasonTooMany, ReasonEncoding, ReasonDecode,
	ReasonDecoder, ReasonRemoteOff, ReasonRemote, ReasonNoVision, ReasonOther}

// Reasons returns every refusal reason, in a fixed order.
func Reasons() []string { return append([]string(nil), reasons[:]...) }

// ReasonOf names why err refused an image: the reason of the first sentinel err wraps, ReasonOther for none.
func ReasonOf(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{ErrTooMany, ReasonTooMany}, {ErrTooLarge, ReasonTooLarge}, {ErrFormat, ReasonFormat},
		{ErrMalformed, ReasonMalformed}, {ErrEncoding, ReasonEncoding}, {ErrDecoder, ReasonDecoder},
		{ErrDecode, ReasonDecode}, {ErrRemoteOff, ReasonRemoteOff}, {ErrRemote, ReasonRemote},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return ReasonOther
}

// Stats counts what becomes of the images requests carry, for /metrics: refusals by reason, decodes in the
// sandboxed child and the time they took, and decoded images found kept (so not decoded again). The web layer
// counts the refusals at the edge, the chat layer those it finds later (a model without a projector, pixels that
// do not decode) and the decodes; each image is counted once, where it is refused or decoded. Safe for concurrent
// use; a nil *Stats counts nothing.
type Stats struct {
	refused                    [len(reasons)]atomic.Int64
	decodes, decodeNanos, kept atomic.Int64
}

// StatsSnapshot is Stats read at one time.
type StatsSnapshot struct {
	Refused    map[string]int64 // by reason, every reason present
	Decodes    int64            // images decoded in the child
	DecodeTime time.Duration    // the time those decodes took, the child's start included
	Kept       int64            // images found decoded already (--image-cache-bytes), so not decoded again
}

// Refused counts one image refused with err (by ReasonOf).
func (s *Stats) Refused(err error) { s.RefusedFor(ReasonOf(err)) }

// RefusedFor counts one image refused for reason (one of Reasons; another counts as ReasonOther).
func (s *Stats) RefusedFor(reason string) {
	if s == nil {
		return
	}
	for i, r := range reasons {
		if r == reason {
			s.refused[i].Add(1)
			return
		}
	}
	s.refused[len(reasons)-1].Add(1)
}

// Decoded counts one image decoded in the child, in d.
func (s *Stats) Decoded(d time.Duration) {
	if s == nil {
		return
	}
	s.decodes.Add(1)
	s.decodeNanos.Add(int64(d))
}

// FoundKept counts one image found decoded already.
func (s *Stats) FoundKept() {
	if s != nil {
		s.kept.Add(1)
	}
}

// Snapshot reads the counters (zeros for a nil *Stats).
func (s *Stats) Snapshot() StatsSnapshot {
	out := StatsSnapshot{Refused: make(map[string]int64, len(reasons))}
	for i, r := range reasons {
		if s != nil {
			out.Refused[r] = s.refused[i].Load()
		} else {
			out.Refused[r] = 0
		}
	}
	if s != nil {
		out.Decodes, out.DecodeTime, out.Kept = s.decodes.Load(), time.Duration(s.decodeNanos.Load()), s.kept.Load()
	}
	return out
}
