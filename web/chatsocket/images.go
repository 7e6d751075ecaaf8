package chatsocket

import (
	"context"
	"fmt"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// imageTurner is the session layer's turn for a prompt with images (*session.Service has it).
type imageTurner interface {
	ImageTurn(ctx context.Context, who parley.Caller, id, prompt string, images []parley.ImagePart, p parley.Params, opts ...session.TurnOption) (*session.Turn, error)
}

// promptImages takes the images of a JSON-mode prompt ({"type":"prompt","images":["data:image/png;base64,..."]}),
// each checked from its header under the server's image limits; a refusal names images[i]. A tool result carries
// none. The reader takes them, so a remote URL (where the server allows any) is fetched under its own time cap.
func (s *Chat) promptImages(ctx context.Context, m clientMessage) ([]parley.ImagePart, error) {
	if len(m.Images) == 0 {
		return nil, nil
	}
	if m.Type != "prompt" {
		return nil, parley.FieldErrorf("images", "only a prompt carries images")
	}
	batch := s.core.Images(ctx)
	out := make([]parley.ImagePart, 0, len(m.Images))
	for i, src := range m.Images {
		im, err := batch.URL(fmt.Sprintf("images[%d]", i), src)
		if err != nil {
			return nil, err
		}
		out = append(out, im)
	}
	return out, nil
}
