package session

import (
	"bytes"
	"testing"

	"github.com/parley-chat/parley"
)

func imgPart(hash string, data string) parley.ImagePart {
	var b []byte
	if data != "" {
		b = []byte(data)
	}
	return parley.ImagePart{SHA256: hash, MediaType: "image/png", Data: b}
}

// A conversation keeps one copy of each image's bytes, on the first message that holds it; a reply gets them all;
// a trim that drops the first holder moves the copy to the first kept one.
func TestShareImages(t *testing.T) {
	msgs := []parley.Message{
		{Role: parley.RoleUser, Content: "a", Images: []parley.ImagePart{imgPart("h1", "one"), imgPart("h2", "two")}},
		{Role: parley.RoleAssistant, Content: "b"},
		{Role: parley.RoleUser, Content: "c", Images: []parley.ImagePart{imgPart("h1", "one")}},
	}
	data := imageData(msgs)
	shared := shareImages(msgs, data)
	if shared[2].Images[0].Data != nil || !bytes.Equal(shared[0].Images[0].Data, []byte("one")) {
		t.Errorf("shared: %+v", shared)
	}
	if msgs[2].Images[0].Data == nil {
		t.Error("shareImages changed its input")
	}
	if got := storedBytes(shared[0], shared[2]); got >= storedBytes(msgs[0], msgs[2]) {
		t.Errorf("a shared copy still counts twice: %d bytes", got)
	}
	full := withImageData(shared)
	if !bytes.Equal(full[2].Images[0].Data, []byte("one")) || shared[2].Images[0].Data != nil {
		t.Errorf("withImageData: %+v (input %+v)", full, shared)
	}
	// The first holder trimmed away: the copy moves to the next message that holds the image.
	kept := shareImages(shared[2:], data)
	if !bytes.Equal(kept[0].Images[0].Data, []byte("one")) {
		t.Errorf("after a trim: %+v", kept)
	}
}

func TestConversationImageCap(t *testing.T) {
	s := &Service{maxImages: 2}
	sess := &Session{Messages: []parley.Message{{Role: parley.RoleUser, Images: []parley.ImagePart{imgPart("h1", "x")}}}}
	if err := s.checkImages(sess, parley.Message{Role: parley.RoleUser, Images: []parley.ImagePart{imgPart("h2", "y")}}); err != nil {
		t.Errorf("the second image: %v", err)
	}
	err := s.checkImages(sess, parley.Message{Role: parley.RoleUser, Images: []parley.ImagePart{imgPart("h2", "y"), imgPart("h3", "z")}})
	if parley.ErrorCode(err) != parley.ETooLarge {
		t.Errorf("past the cap: %v", err)
	}
}
