package chatsocket

import (
	"testing"

	"github.com/parley-chat/parley/web/internal/apicore"
)

// A resume waits until the replies of its session settle (conn.waitSettled,
// on the channel liveReply.settled returns). A cancelled reply (its socket
// dropped under --resume-grace 0) settles only when it ends, so its end
// must wake the wait; otherwise the resume sits out apicore.SettleWait.
func TestEndOfACancelledReplyWakesTheResume(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cancelled bool
		end       func(r *liveReply)
	}{
		{"cancelled, then ended by its pump", true, (*liveReply).end},
		{"never started", false, (*liveReply).fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			released := 0
			srv := &Chat{}
			r := &liveReply{srv: srv, sid: "s", cancel: func() {}, hold: newAdmission(func() { released++ }),
				wake: make(chan struct{}), ended: make(chan struct{})}
			srv.replies.wg.Add(1) // as replyRegistry.open does
			if tc.cancelled {
				r.stop(apicore.CancelByDisconnect)
			}
			ok, changed := r.settled()
			if ok {
				t.Fatal("a reply that has not ended is settled; want a wait")
			}
			tc.end(r)
			select {
			case <-changed:
			default:
				t.Fatal("the reply ended, but the channel a resume waits on was not closed")
			}
			if ok, _ := r.settled(); !ok {
				t.Error("an ended reply is not settled")
			}
			if released != 1 {
				t.Errorf("the admission was released %d times, want 1", released)
			}
		})
	}
}
