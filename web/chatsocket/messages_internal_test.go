package chatsocket

import (
	"errors"
	"reflect"
	"testing"

	"github.com/parley-chat/parley"
)

// A prompt's content may be parts: their text joined, each image_url part placed where it stands among the text;
// a malformed part is refused naming it.
func TestPromptContentParts(t *testing.T) {
	for _, tc := range []struct {
		name, msg string
		content   string
		placed    []placedImage
		field     string // refused, naming this field
	}{
		{name: "a string", msg: `{"type":"prompt","content":"hi","images":["AAAA"]}`, content: "hi"},
		{name: "image between texts", msg: `{"type":"prompt","content":[{"type":"text","text":"Look: "},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"what is it?"}]}`,
			content: "Look: what is it?", placed: []placedImage{{src: "data:image/png;base64,AAAA", part: "content[1]", offset: 6}}},
		{name: "images first and last, url as a string", msg: `{"type":"prompt","content":[{"type":"image_url","image_url":"AAAA"},{"type":"text","text":"é"},{"type":"image_url","image_url":{"url":"BBBB"}}]}`,
			content: "é", placed: []placedImage{{src: "AAAA", part: "content[0]"}, {src: "BBBB", part: "content[2]", offset: 2}}},
		{name: "only an image", msg: `{"type":"prompt","content":[{"type":"image_url","image_url":"AAAA"}]}`,
			content: "", placed: []placedImage{{src: "AAAA", part: "content[0]"}}},
		{name: "empty parts", msg: `{"type":"prompt","content":[]}`, field: "content"},
		{name: "unknown part", msg: `{"type":"prompt","content":[{"type":"audio"}]}`, field: "content[0].type"},
		{name: "text part without text", msg: `{"type":"prompt","content":[{"type":"text"}]}`, field: "content[0].text"},
		{name: "image part without url", msg: `{"type":"prompt","content":[{"type":"image_url"}]}`, field: "content[0].image_url"},
		{name: "parts and images", msg: `{"type":"prompt","content":[{"type":"image_url","image_url":"AAAA"}],"images":["BBBB"]}`, field: "images"},
		{name: "a system prompt of parts", msg: `{"type":"system","content":[{"type":"text","text":"x"}]}`, field: "content"},
		{name: "content a number", msg: `{"type":"prompt","content":5}`, field: "content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseClientMessage([]byte(tc.msg))
			if tc.field != "" {
				var pe *parley.Error
				if !errors.As(err, &pe) || pe.Field != tc.field {
					t.Fatalf("got %v, want a refusal naming %s", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Content == nil || *m.Content != tc.content || !reflect.DeepEqual(m.Placed, tc.placed) {
				t.Errorf("content %v, placed %+v; want %q, %+v", m.Content, m.Placed, tc.content, tc.placed)
			}
		})
	}
}
