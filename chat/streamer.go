package chat

import (
	"strings"
	"unicode/utf8"
)

// Streamer turns the raw pieces of a generated reply into text that is safe
// to show as it arrives. Tokens are byte sequences: one may end in the middle
// of a UTF-8 character, and a stop string may be spread over several of them.
// A Streamer therefore holds back
//
//   - an incomplete UTF-8 sequence at the end of the input, until the bytes
//     that complete it arrive (bytes that can never become valid UTF-8 are
//     replaced with U+FFFD at once, one per byte, as Go's range loop does);
//   - the longest tail of the text that is the beginning of a stop string,
//     until it either becomes the stop string or stops being a prefix of one.
//
// Invariants: every string Push or Flush returns is valid UTF-8, and their
// concatenation equals the whole reply (invalid bytes replaced) up to, not
// including, the first stop string. "First" is the occurrence that is
// complete earliest; of two completing together, the one that starts first.
// This does not depend on how the reply was split into pieces.
//
// A Streamer is used by one goroutine.
type Streamer struct {
	stops   []string // non-empty, valid UTF-8
	maxStop int      // bytes in the longest stop string
	partial []byte   // an incomplete UTF-8 sequence at the end of the input (< utf8.UTFMax bytes)
	held    string   // valid text that may be the start of a stop string
	stopped bool     // a stop string matched; nothing more is emitted
	matched string   // the stop string that matched, once stopped
	flushed bool     // Flush was called; the stream is over
}

// NewStreamer returns a Streamer that ends the text at any of stops. Empty
// stop strings are ignored; invalid bytes in a stop string are replaced with
// U+FFFD, so that it matches text the way the text is emitted.
func NewStreamer(stops []string) *Streamer {
	s := &Streamer{}
	for _, stop := range stops {
		if stop == "" {
			continue
		}
		stop = validUTF8(stop)
		s.stops = append(s.stops, stop)
		s.maxStop = max(s.maxStop, len(stop))
	}
	return s
}

// Push adds the next raw piece of the reply and returns the text that is now
// safe to emit (possibly ""). stopped reports that a stop string matched:
// emit is the text before it, and the Streamer emits nothing more.
func (s *Streamer) Push(piece string) (emit string, stopped bool) {
	if s.stopped || s.flushed {
		return "", s.stopped
	}
	return s.scan(s.decode(piece, false))
}

// Flush ends the stream and returns whatever was held back, as valid UTF-8
// (an incomplete trailing sequence becomes U+FFFD). If that completes a stop
// string, only the text before it is returned and Stopped reports true.
// The Streamer emits nothing after Flush.
func (s *Streamer) Flush() string {
	if s.stopped || s.flushed {
		return ""
	}
	s.flushed = true
	text := s.held + s.decode("", true)
	s.held = ""
	if i, ok := s.findStop(text); ok {
		s.stopped = true
		return text[:i]
	}
	return text
}

// Stopped reports whether a stop string has matched.
func (s *Streamer) Stopped() bool { return s.stopped }

// Matched returns the stop string that matched ("" while none has).
func (s *Streamer) Matched() string { return s.matched }

// holding reports whether any input is held back, waiting for more.
func (s *Streamer) holding() bool { return len(s.partial) > 0 || s.held != "" }

// matchesStop reports whether text contains one of the stop strings, and
// records the first that it contains as the one that matched.
func (s *Streamer) matchesStop(text string) bool {
	for _, stop := range s.stops {
		if strings.Contains(text, stop) {
			s.matched = stop
			return true
		}
	}
	return false
}

// decode appends piece to the held incomplete sequence and returns the valid
// text that the bytes make, keeping a new incomplete tail unless final.
func (s *Streamer) decode(piece string, final bool) string {
	buf := piece
	if len(s.partial) > 0 {
		buf = string(s.partial) + piece
		s.partial = s.partial[:0]
	}
	var b strings.Builder
	b.Grow(len(buf))
	for i := 0; i < len(buf); {
		if buf[i] < utf8.RuneSelf {
			b.WriteByte(buf[i])
			i++
			continue
		}
		if !final && !utf8.FullRuneInString(buf[i:]) {
			// A valid prefix of a multi-byte character that the next piece
			// may complete. FullRune reports true for bytes that can never
			// be completed, so this tail is shorter than utf8.UTFMax.
			s.partial = append(s.partial, buf[i:]...)
			break
		}
		r, size := utf8.DecodeRuneInString(buf[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString(string(utf8.RuneError))
		} else {
			b.WriteString(buf[i : i+size])
		}
		i += size
	}
	return b.String()
}

// scan adds valid text after what is held, and returns what can be emitted.
func (s *Streamer) scan(text string) (string, bool) {
	p := s.held + text
	if i, ok := s.findStop(p); ok {
		s.held = ""
		s.stopped = true
		return p[:i], true
	}
	k := s.holdFrom(p)
	s.held = p[k:]
	return p[:k], false
}

// findStop returns where in p the first complete stop string starts: the
// occurrence that ends earliest, and of those the one that starts earliest.
// It records that stop string as the one that matched.
func (s *Streamer) findStop(p string) (int, bool) {
	start, end := -1, 0
	for _, stop := range s.stops {
		i := strings.Index(p, stop)
		if i < 0 {
			continue
		}
		if e := i + len(stop); start < 0 || e < end || (e == end && i < start) {
			start, end = i, e
			s.matched = stop
		}
	}
	return start, start >= 0
}

// holdFrom returns the smallest k such that p[k:] is a proper prefix of a
// stop string (len(p) when there is none). p has no complete stop string.
// Since stop strings are valid UTF-8, p[k] starts a character, so p[:k] is
// valid UTF-8 too.
func (s *Streamer) holdFrom(p string) int {
	for k := max(0, len(p)-s.maxStop+1); k < len(p); k++ {
		if !utf8.RuneStart(p[k]) {
			continue
		}
		tail := p[k:]
		for _, stop := range s.stops {
			if len(tail) < len(stop) && strings.HasPrefix(stop, tail) {
				return k
			}
		}
	}
	return len(p)
}

// validUTF8 replaces each invalid byte of s with U+FFFD, as decode does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}
