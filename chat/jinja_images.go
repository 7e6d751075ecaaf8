package chat

import (
	"encoding/json"
	"strings"

	"github.com/parley-chat/parley"
)

// Images in a Jinja template. A vision model's template iterates a message's content parts and writes its own
// text for {"type": "image"} (Gemma 3's <start_of_image>, Qwen2-VL's vision tokens, SmolVLM's <image>), as Hugging
// Face's processors pass images. Such a template sees its images that way: what it writes for one image is found
// once, by rendering a one-image message beside the same message without it (imageText), and each such text in a
// rendered prompt becomes parley.ImageMarker, where the engine's libmtmd puts the image with the tokens its model
// wraps images in. A template that never names images, or whose image text cannot be told apart, sees a message's
// images as marker lines in its text content, as llama.cpp's server passes them.

// imageProbeText is the text of the probe message: a word no template writes on its own.
const imageProbeText = "PARLEYIMAGEPROBE"

// typedImages reports whether tmpl takes images as content parts ({"type":"image"}) rather than marker lines.
func typedImages(tmpl Template) bool {
	j, ok := tmpl.(*Jinja)
	return ok && j.imageText() != ""
}

// imageText is what the template writes for one image part ("" when it takes images as text), found once.
func (t *Jinja) imageText() string {
	t.imageOnce.Do(func() {
		if !strings.Contains(t.src, "image") {
			return
		}
		render := func(images int) (string, bool) {
			vars, err := buildVars([]parley.Message{{Role: parley.RoleUser, Content: imageProbeText, Images: make([]parley.ImagePart, images)}},
				RenderOptions{}, t.bos, t.eos, t.now().Unix(), t.thinkingKey, true)
			if err != nil {
				return "", false
			}
			out, err := t.renderer.RenderJinja(t.src, vars)
			return out, err == nil
		}
		with, ok1 := render(1)
		without, ok2 := render(0)
		if !ok1 || !ok2 || with == without {
			return
		}
		p := 0
		for p < len(with) && p < len(without) && with[p] == without[p] {
			p++
		}
		s := 0
		for s < len(with)-p && s < len(without)-p && with[len(with)-1-s] == without[len(without)-1-s] {
			s++
		}
		if len(without)-p-s != 0 { // the image changed more than one place: not told apart
			return
		}
		if text := with[p : len(with)-s]; strings.TrimSpace(text) != "" && !strings.Contains(text, imageProbeText) {
			t.imageTextV = text
		}
	})
	return t.imageTextV
}

// imageParts is a message's content as parts, in the client's order: its text, with each image part where the
// client put it (ImagePart.Offset). Empty text between images makes no part; the text after the last image is a
// part when it is not empty or is all the text there is (a message of images alone keeps its empty text part).
func imageParts(m parley.Message) json.RawMessage {
	segs := parley.ContentSegments(m)
	parts := make([]map[string]string, 0, len(segs)+len(m.Images))
	for i, seg := range segs {
		if i == len(segs)-1 {
			if seg != "" || len(parts) == len(m.Images) {
				parts = append(parts, map[string]string{"type": "text", "text": seg})
			}
			break
		}
		if seg != "" {
			parts = append(parts, map[string]string{"type": "text", "text": seg})
		}
		parts = append(parts, map[string]string{"type": "image"})
	}
	b, _ := json.Marshal(parts) // strings cannot fail to marshal
	return b
}

// markTemplateImages replaces each image's text in a rendered prompt by parley.ImageMarker; it fails when the
// prompt holds that text another number of times than there are images.
func markTemplateImages(out, text string, images int) (string, error) {
	if n := strings.Count(out, text); n != images {
		return "", parley.Errorf(parley.EInvalid, "the chat template wrote its image text %q %d times for %d images", text, n, images)
	}
	return strings.ReplaceAll(out, text, parley.ImageMarker), nil
}
