package apicore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"testing"

	"github.com/parley-chat/parley/web/internal/apicore"
)

// pngDataURL is a data: URL of a w x h PNG.
func pngDataURL(t *testing.T, w, h int) string {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// Each image part keeps its place among the text parts: its offset is the length of the text before it.
func TestParseContentPartsKeepsImagePlaces(t *testing.T) {
	url := pngDataURL(t, 2, 2)
	raw, err := json.Marshal([]map[string]any{
		{"type": "image_url", "image_url": map[string]string{"url": url}},
		{"type": "text", "text": "Compare "},
		{"type": "image_url", "image_url": map[string]string{"url": url}},
		{"type": "text", "text": "with "},
		{"type": "image_url", "image_url": map[string]string{"url": url}},
		{"type": "image_url", "image_url": map[string]string{"url": url}},
		{"type": "text", "text": "now."},
	})
	if err != nil {
		t.Fatal(err)
	}
	images := (&apicore.Core{}).Images(context.Background())
	text, ims, err := apicore.ParseContentParts(raw, "messages[0].content", images, []string{"text"}, "image_url")
	if err != nil {
		t.Fatal(err)
	}
	if text != "Compare with now." || len(ims) != 4 {
		t.Fatalf("text %q, %d images", text, len(ims))
	}
	for i, want := range []int{0, len("Compare "), len("Compare with "), len("Compare with ")} {
		if ims[i].Offset != want {
			t.Errorf("image %d at %d, want %d", i, ims[i].Offset, want)
		}
	}
}
