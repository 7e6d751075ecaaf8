package chatsocket

import (
	"context"
	"errors"
	"fmt"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// imageTurner is the session layer's turn for a prompt with images (*session.Service has it).
type imageTurner interface {
	ImageTurn(ctx context.Context, who parley.Caller, id, prompt string, images []parley.ImagePart, p parley.Params, opts ...session.TurnOption) (*session.Turn, error)
}

// promptImages takes the images of a JSON-mode prompt, each checked from its header under the server's image
// limits: those of {"type":"prompt","images":["data:image/png;base64,..."]}, placed before the text (a refusal
// names images[i]), or the image_url parts of its content, each where it stands among the text parts (a refusal
// names content[i]). A tool result carries none. The reader takes them, so a remote URL (where the server allows
// any) is fetched under its own time cap.
func (s *Chat) promptImages(ctx context.Context, m clientMessage) ([]parley.ImagePart, error) {
	if len(m.Images) == 0 && len(m.Placed) == 0 {
		return nil, nil
	}
	if m.Type != "prompt" {
		return nil, parley.FieldErrorf("images", "only a prompt carries images")
	}
	batch := s.core.Images(ctx)
	placed := m.Placed
	if len(placed) == 0 {
		for i, src := range m.Images {
			placed = append(placed, placedImage{src: src, part: fmt.Sprintf("images[%d]", i)})
		}
	}
	out := make([]parley.ImagePart, 0, len(placed))
	for _, p := range placed {
		im, err := batch.URL(p.part, p.src)
		if err != nil {
			return nil, err
		}
		im.Offset = p.offset
		out = append(out, im)
	}
	return out, nil
}

// imageBytes is the bytes of images: what they hold in memory until decoded.
func imageBytes(images []parley.ImagePart) int64 {
	var n int64
	for _, im := range images {
		n += int64(len(im.Data))
	}
	return n
}

// waitingImagesRefusal is the body budget's refusal of a prompt's images,
// which would wait in the queue, told as such: its code and retry time,
// and what to do.
func waitingImagesRefusal(err error) error {
	var pe *parley.Error
	if !errors.As(err, &pe) {
		return err
	}
	out := *pe
	if out.Code == parley.ERateLimited {
		out.Message = "the images of your prompts waiting for their turn take all the room one client may hold: send this prompt again once a reply has ended"
	} else {
		out.Message = "the server holds as many images of prompts waiting for their turn as it may now: try again shortly"
	}
	return &out
}
