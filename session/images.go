package session

import (
	"context"
	"slices"

	"github.com/parley-chat/parley"
)

// Images in stored conversations. A message keeps its images (parley.ImagePart: bytes, sha256, media type); a
// conversation keeps one copy of each image's bytes, on the first message that holds it, the later ones only its
// hash (shareImages, on every store), and the bytes count against the session's byte cap as text does. A reply gets
// every image whole (withImageData).

// WithMaxConversationImages caps the images one conversation may hold (a prompt that would pass it is refused);
// <= 0 means no cap.
func WithMaxConversationImages(n int) Option { return func(s *Service) { s.maxImages = n } }

// ImageTurn is Turn for a prompt that carries images (text may then be empty).
func (s *Service) ImageTurn(ctx context.Context, who parley.Caller, id, prompt string, images []parley.ImagePart, p parley.Params, opts ...TurnOption) (*Turn, error) {
	if prompt == "" && len(images) == 0 {
		return nil, parley.FieldErrorf("prompt", "must not be empty")
	}
	return s.turn(ctx, who, id, parley.Message{Role: parley.RoleUser, Content: prompt, Images: images}, p, opts)
}

// checkImages refuses input when the conversation would hold more than the cap's images.
func (s *Service) checkImages(sess *Session, input parley.Message) error {
	if s.maxImages <= 0 || len(input.Images) == 0 {
		return nil
	}
	if n := parley.ImageCount(sess.Messages) + len(input.Images); n > s.maxImages {
		return parley.Errorf(parley.ETooLarge, "a conversation keeps at most %d images; this prompt would make %d: start a new conversation", s.maxImages, n)
	}
	return nil
}

// imageBytes is the bytes of the images m keeps (their encoded data).
func imageBytes(m parley.Message) int {
	n := 0
	for _, im := range m.Images {
		n += len(im.Data) + len(im.SHA256) + len(im.MediaType)
	}
	return n
}

// imageData maps each image's hash to its bytes, from every message of msgs that holds them.
func imageData(msgs []parley.Message) map[string][]byte {
	var out map[string][]byte
	for _, m := range msgs {
		for _, im := range m.Images {
			if len(im.Data) > 0 {
				if out == nil {
					out = map[string][]byte{}
				}
				out[im.SHA256] = im.Data
			}
		}
	}
	return out
}

// shareImages returns msgs with each image's bytes on the first message that holds it and on no later one, the
// bytes taken from data (gathered before older messages were trimmed away, so that trimming never loses the copy a
// later message needs). msgs's messages are copied where they change; msgs itself is not changed.
func shareImages(msgs []parley.Message, data map[string][]byte) []parley.Message {
	if len(data) == 0 {
		return msgs
	}
	seen := map[string]bool{}
	var out []parley.Message
	for i, m := range msgs {
		for j, im := range m.Images {
			want := data[im.SHA256]
			if seen[im.SHA256] {
				want = nil
			}
			seen[im.SHA256] = true
			if len(want) == len(im.Data) && (len(want) == 0 || &want[0] == &im.Data[0]) {
				continue
			}
			if out == nil {
				out = slices.Clone(msgs)
			}
			if &out[i].Images[0] == &msgs[i].Images[0] {
				out[i].Images = slices.Clone(m.Images)
			}
			out[i].Images[j].Data = want
		}
	}
	if out == nil {
		return msgs
	}
	return out
}

// withImageData returns msgs with every image's bytes in place (a stored conversation keeps them once), for the
// reply; an image whose bytes the conversation lost keeps none, and the chat layer refuses it by name.
func withImageData(msgs []parley.Message) []parley.Message {
	data := imageData(msgs)
	var out []parley.Message
	for i, m := range msgs {
		for j, im := range m.Images {
			if len(im.Data) > 0 || data[im.SHA256] == nil {
				continue
			}
			if out == nil {
				out = slices.Clone(msgs)
			}
			if &out[i].Images[0] == &msgs[i].Images[0] {
				out[i].Images = slices.Clone(m.Images)
			}
			out[i].Images[j].Data = data[im.SHA256]
		}
	}
	if out == nil {
		return msgs
	}
	return out
}
