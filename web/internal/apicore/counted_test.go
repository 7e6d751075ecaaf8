package apicore_test

import (
	"encoding/json"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// TestCountedText: the edge counts no text of a conversation the responder
// counts as it renders it (and stops at the cap), and all of it (with the
// tools) for one with images, whose prompt the responder tokenizes whole.
func TestCountedText(t *testing.T) {
	tools := []parley.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`)}}
	plain := []parley.Message{{Role: parley.RoleUser, Content: "a long question"}}
	if got := apicore.CountedText(plain, tools); got != "" {
		t.Errorf("without images: %q, want none", got)
	}
	withImage := []parley.Message{{Role: parley.RoleUser, Content: "what is this?", Images: []parley.ImagePart{{MediaType: "image/png"}}}}
	if got, want := apicore.CountedText(withImage, tools), apicore.PromptText(withImage, tools); got != want || got == "" {
		t.Errorf("with an image: %q, want the whole text %q", got, want)
	}
}
