package session

import (
	"context"
	"slices"

	"github.com/parley-chat/parley"
)

// Images in stored conversations. A message keeps its images (parley.ImagePart: bytes, sha256, media type); a
// conversation keeps one copy of each image's bytes, on the first message that holds it, the later ones only its
// hash (shareImages, on every store). A reply gets every image whole (withImageData).
//
// A conversation's images are held to limits of their own, apart from the per-session cap of text (WithMaxBytes),
// which never counts them: a number of images (WithMaxConversationImages) and their bytes, one copy of each
// (WithMaxConversationImageBytes). A prompt whose images would take the conversation past either is refused before
// its reply starts and before anything is written, so the conversation stays as it was; images are never trimmed to
// make room (they go only with their turn, when the cap of text drops it). The store's byte budget
// (WithMaxStoreBytes) counts their bytes with everything else.

// WithMaxConversationImages caps the images one conversation may hold (a prompt that would pass it is refused);
// <= 0 means no cap.
func WithMaxConversationImages(n int) Option { return func(s *Service) { s.maxImages = n } }

// WithMaxConversationImageBytes caps the bytes of the images one conversation may hold, each image's once (a prompt
// whose new images would pass it is refused); <= 0 means no cap.
func WithMaxConversationImageBytes(n int64) Option { return func(s *Service) { s.maxImageBytes = n } }

// ImageTurn is Turn for a prompt that carries images (text may then be empty).
func (s *Service) ImageTurn(ctx context.Context, who parley.Caller, id, prompt string, images []parley.ImagePart, p parley.Params, opts ...TurnOption) (*Turn, error) {
	if prompt == "" && len(images) == 0 {
		return nil, parley.FieldErrorf("prompt", "must not be empty")
	}
	return s.turn(ctx, who, id, parley.Message{Role: parley.RoleUser, Content: prompt, Images: images}, p, opts)
}

// checkImages refuses input, messages to be added to sess's conversation, when the conversation would then hold
// more images than the cap, or more bytes of images than their budget. Only new images are held to the budget:
// one the conversation holds already costs nothing again, and a turn without new images is never refused, even
// in a conversation over a budget lowered since.
func (s *Service) checkImages(sess *Session, input ...parley.Message) error {
	n := parley.ImageCount(input)
	if n == 0 {
		return nil
	}
	if s.maxImages > 0 {
		if total := parley.ImageCount(sess.Messages) + n; total > s.maxImages {
			return parley.Errorf(parley.ETooLarge, "a conversation keeps at most %d images (--image-max-per-conversation); this prompt would make %d: start a new conversation", s.maxImages, total)
		}
	}
	if s.maxImageBytes <= 0 {
		return nil
	}
	held := imageSizes(sess.Messages)
	var total, added int64
	for _, size := range held {
		total += size
	}
	for _, m := range input {
		for _, im := range m.Images {
			if _, ok := held[im.SHA256]; !ok {
				held[im.SHA256] = int64(len(im.Data))
				added += int64(len(im.Data))
			}
		}
	}
	if added > 0 && total+added > s.maxImageBytes {
		return parley.Errorf(parley.ETooLarge, "this conversation's images would take %s, past the %s one conversation may keep (--image-max-bytes-per-conversation; it holds %s): start a new conversation, or send smaller images",
			humanBytes(total+added), humanBytes(s.maxImageBytes), humanBytes(total))
	}
	return nil
}

// imageSizes maps each image msgs hold to its bytes (a conversation keeps one copy of each).
func imageSizes(msgs []parley.Message) map[string]int64 {
	out := map[string]int64{}
	for _, m := range msgs {
		for _, im := range m.Images {
			out[im.SHA256] = max(out[im.SHA256], int64(len(im.Data)))
		}
	}
	return out
}

// imageBytes is the bytes of the images m keeps (their encoded data, and what names them).
func imageBytes(m parley.Message) int {
	n := 0
	for _, im := range m.Images {
		n += len(im.Data) + len(im.SHA256) + len(im.MediaType)
	}
	return n
}

// storedBytes is what msgs take in a stored session at least: their text and their images' bytes (the store's
// byte budget counts both).
func storedBytes(msgs ...parley.Message) int {
	n := 0
	for _, m := range msgs {
		n += messageBytes(m) + imageBytes(m)
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
