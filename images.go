package parley

// ImagePart is one image a message carries: its encoded bytes as the client sent them (accepted under the server's
// image limits before it gets here: format, bytes, pixels), their sha256, and its media type by its magic number.
// Within a message a template sees the images before the text, in the order the client gave them.
type ImagePart struct {
	SHA256    string `json:"sha256"`     // hex sha256 of Data: the image's identity in stores and caches
	MediaType string `json:"media_type"` // image/png, image/jpeg, image/webp or image/gif
	Data      []byte `json:"data,omitempty"`
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
