package parley

import "unicode/utf8"

// ImagePart is one image a message carries: its encoded bytes as the client sent them (accepted under the server's
// image limits before it gets here: format, bytes, pixels), their sha256, its media type by its magic number, and
// where it stands among the message's text. A template sees a message's images where the client put them, in
// the order it gave them.
type ImagePart struct {
	SHA256    string `json:"sha256"`     // hex sha256 of Data: the image's identity in stores and caches
	MediaType string `json:"media_type"` // image/png, image/jpeg, image/webp or image/gif
	Data      []byte `json:"data,omitempty"`
	// Offset is the byte offset in the message's Content before which the image stands: 0 before all of the text
	// (where an API that takes images apart from the text, Ollama's images, puts them), len(Content) after it. A
	// message's images are in order, their offsets never decreasing; one past the text counts as at its end.
	Offset int `json:"offset,omitempty"`
	// Part names where the request carried it ("messages[1].content[0]"), so a refusal names it; not stored.
	Part string `json:"-"`
}

// ImageCount is the number of images msgs carry.
func ImageCount(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Images)
	}
	return n
}

// ContentSegments splits m's Content at its images' offsets: len(m.Images)+1 pieces of text, image i standing
// between pieces i and i+1. Offsets past the text or before the previous image's are taken as the nearest valid
// place, and one inside a UTF-8 character as that character's start.
func ContentSegments(m Message) []string {
	segs := make([]string, 0, len(m.Images)+1)
	at := 0
	for _, im := range m.Images {
		off := min(max(im.Offset, at), len(m.Content))
		for off > at && off < len(m.Content) && !utf8.RuneStart(m.Content[off]) {
			off--
		}
		segs = append(segs, m.Content[at:off])
		at = off
	}
	return append(segs, m.Content[at:])
}
