package parley_test

import (
	"strings"
	"testing"

	"github.com/parley-chat/parley"
)

func TestAffinityKey(t *testing.T) {
	sys := parley.Message{Role: parley.RoleSystem, Content: "You are terse."}
	u1 := parley.Message{Role: parley.RoleUser, Content: "Lily found a red ball."}
	a1 := parley.Message{Role: parley.RoleAssistant, Content: "She played with it."}
	u2 := parley.Message{Role: parley.RoleUser, Content: "Then what?"}
	turn1 := []parley.Message{sys, u1}
	turn2 := []parley.Message{sys, u1, a1, u2}

	derived := parley.AffinityKey("ann", "", turn1)
	if !strings.HasPrefix(derived, "c-") || len(derived) != 34 {
		t.Fatalf("derived key %q: want c- and 32 hex digits", derived)
	}
	for _, tc := range []struct {
		name      string
		user      string
		sent      string
		msgs      []parley.Message
		same      bool // as derived
		wantExact string
	}{
		{name: "the next turn of the same conversation", user: "ann", msgs: turn2, same: true},
		{name: "another user, the same opening", user: "bob", msgs: turn1},
		{name: "the anonymous user", user: "", msgs: turn1},
		{name: "another system prompt", user: "ann", msgs: []parley.Message{{Role: parley.RoleSystem, Content: "You are kind."}, u1}},
		{name: "another first question", user: "ann", msgs: []parley.Message{sys, u2}},
		{name: "no system prompt", user: "ann", msgs: []parley.Message{u1}},
		{name: "a key sent is kept", user: "ann", sent: "sess_01HXYZ-a.b:c", msgs: turn1, wantExact: "sess_01HXYZ-a.b:c"},
		{name: "a key sent wins over the opening, whoever sends it", user: "bob", sent: "conv_1", msgs: turn2, wantExact: "conv_1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parley.AffinityKey(tc.user, tc.sent, tc.msgs)
			switch {
			case tc.wantExact != "":
				if got != tc.wantExact {
					t.Fatalf("got %q, want %q", got, tc.wantExact)
				}
			case tc.same && got != derived:
				t.Fatalf("got %q, want the first turn's %q", got, derived)
			case !tc.same && got == derived:
				t.Fatalf("got the first conversation's key %q", got)
			}
		})
	}

	// Concatenation does not collide: the user and the opening are framed.
	if parley.DeriveAffinityKey("a", []parley.Message{{Role: parley.RoleUser, Content: "bc"}}) ==
		parley.DeriveAffinityKey("ab", []parley.Message{{Role: parley.RoleUser, Content: "c"}}) {
		t.Fatal("user and opening collide by concatenation")
	}
	if parley.DeriveAffinityKey("ann", nil) != "" {
		t.Fatal("an empty conversation has a key")
	}

	// A key unsafe for a header or too long comes back hashed, and the
	// hashed key, sent again, comes back as it is: what the balancer hashes
	// on stays the same from turn to turn.
	for _, sent := range []string{"has space", "line\r\nX-Evil: 1", "ключ", strings.Repeat("k", 129)} {
		got := parley.AffinityKey("ann", sent, turn1)
		if !strings.HasPrefix(got, "k-") || len(got) != 34 {
			t.Fatalf("sent %q: got %q, want k- and 32 hex digits", sent, got)
		}
		if again := parley.AffinityKey("ann", got, turn2); again != got {
			t.Fatalf("sent %q: %q sent again became %q", sent, got, again)
		}
	}
	if got := parley.AffinityKey("ann", strings.Repeat("k", 128), nil); got != strings.Repeat("k", 128) {
		t.Fatalf("a 128-byte key was changed: %q", got)
	}
}
