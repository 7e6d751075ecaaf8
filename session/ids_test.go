package session_test

import (
	"strings"
	"testing"

	"github.com/parley-chat/parley/session"
)

// TestItemIDs: an item id names its position, hides its session id, and
// ids of the earlier form ("msg_" + session id + position) still resolve.
func TestItemIDs(t *testing.T) {
	sid, err := session.NewID()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := session.NewID()
	id := session.ItemID(sid, 7)
	if !strings.HasPrefix(id, session.ItemPrefix) || strings.Contains(id, sid) {
		t.Fatalf("item id %q: want the prefix and no session id", id)
	}
	for _, c := range []struct {
		sid, id string
		want    int
		ok      bool
	}{
		{sid, id, 7, true},
		{sid, session.ItemID(sid, 0), 0, true},
		{sid, session.ItemPrefix + sid + "12", 12, true}, // the earlier form
		{other, id, 0, false},                            // another session's item
		{sid, session.SystemItemID(sid), 0, false},
		{sid, session.ItemID(sid, 7) + "x", 0, false},
		{sid, session.ItemPrefix + sid + "-1", 0, false},
		{sid, session.ItemPrefix + sid + "07", 0, false},
		{sid, "rs_" + sid, 0, false},
	} {
		if got, ok := session.ItemPosition(c.sid, c.id); ok != c.ok || ok && got != c.want {
			t.Errorf("ItemPosition(%q) = %d, %v; want %d, %v", c.id, got, ok, c.want, c.ok)
		}
	}
	if got := session.CanonicalItemID(sid, session.ItemPrefix+sid+"3"); got != session.ItemID(sid, 3) {
		t.Errorf("earlier form: got %q, want %q", got, session.ItemID(sid, 3))
	}
	if got := session.CanonicalItemID(sid, id); got != id {
		t.Errorf("current form changed: %q", got)
	}
	if got := session.ConversationID(sid); got != session.ConversationPrefix+sid {
		t.Errorf("conversation id %q", got)
	}
}
