package apicore_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// TestCountedText: the edge counts no text of a conversation the responder
// counts as it renders it (and stops at the cap), unless the text is far
// longer in bytes than the cap in tokens (a huge one is refused before it
// is rendered) or the conversation has images, whose prompt the responder
// tokenizes whole; then all of it, the tools with it. Without a cap it
// counts none.
func TestCountedText(t *testing.T) {
	tools := []parley.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`)}}
	plain := []parley.Message{{Role: parley.RoleUser, Content: strings.Repeat("a long question ", 50)}} // 821 bytes with the tool
	for _, tc := range []struct {
		name  string
		msgs  []parley.Message
		cap   int
		whole bool
	}{
		{"within the bound", plain, 103, false}, // at most 8 bytes a token of the cap
		{"past the bound", plain, 102, true},
		{"no cap", plain, 0, false},
		{"an image", []parley.Message{{Role: parley.RoleUser, Content: "what is this?", Images: []parley.ImagePart{{MediaType: "image/png"}}}}, 1000, true},
	} {
		got := apicore.CountedText(tc.msgs, tools, tc.cap)
		if want := apicore.PromptText(tc.msgs, tools); tc.whole && (got != want || got == "") {
			t.Errorf("%s: %q, want the whole text %q", tc.name, got, want)
		} else if !tc.whole && got != "" {
			t.Errorf("%s: %q, want none", tc.name, got)
		}
	}
}
