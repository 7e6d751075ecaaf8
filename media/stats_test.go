package media_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-chat/parley/media"
)

// Each refusal is counted under the reason of the sentinel it wraps, every reason's series is there from the
// start, and a nil *Stats counts nothing without failing.
func TestStatsCountsRefusalsByReason(t *testing.T) {
	var st media.Stats
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: BMP", media.ErrFormat), media.ReasonFormat},
		{&media.PartError{Part: "images[0]", Err: fmt.Errorf("%w: 9x9", media.ErrTooLarge)}, media.ReasonTooLarge},
		{fmt.Errorf("%w: more than 16", media.ErrTooMany), media.ReasonTooMany},
		{fmt.Errorf("%w: bad base64", media.ErrEncoding), media.ReasonEncoding},
		{fmt.Errorf("%w: truncated", media.ErrDecode), media.ReasonDecode},
		{fmt.Errorf("%w: no child", media.ErrDecoder), media.ReasonDecoder},
		{media.ErrRemoteOff, media.ReasonRemoteOff},
		{fmt.Errorf("%w: loopback", media.ErrRemote), media.ReasonRemote},
		{fmt.Errorf("%w: header", media.ErrMalformed), media.ReasonMalformed},
		{fmt.Errorf("something else"), media.ReasonOther},
	} {
		if got := media.ReasonOf(tc.err); got != tc.want {
			t.Errorf("ReasonOf(%v) = %s, want %s", tc.err, got, tc.want)
		}
		st.Refused(tc.err)
	}
	st.RefusedFor(media.ReasonNoVision)
	st.RefusedFor("no such reason")
	st.Decoded(2 * time.Millisecond)
	st.FoundKept()
	snap := st.Snapshot()
	if len(snap.Refused) != len(media.Reasons()) {
		t.Errorf("%d reasons in the snapshot, want %d", len(snap.Refused), len(media.Reasons()))
	}
	for _, r := range media.Reasons() {
		want := int64(1)
		if r == media.ReasonOther {
			want = 2
		}
		if snap.Refused[r] != want {
			t.Errorf("%s: %d refusals, want %d", r, snap.Refused[r], want)
		}
	}
	if snap.Decodes != 1 || snap.DecodeTime != 2*time.Millisecond || snap.Kept != 1 {
		t.Errorf("decodes %d in %v, kept %d", snap.Decodes, snap.DecodeTime, snap.Kept)
	}
	var none *media.Stats
	none.Refused(media.ErrFormat)
	none.Decoded(time.Second)
	none.FoundKept()
	if s := none.Snapshot(); s.Refused[media.ReasonFormat] != 0 || s.Decodes != 0 || len(s.Refused) != len(media.Reasons()) {
		t.Errorf("a nil Stats: %+v", s)
	}
}

// A request's images may take MaxImages data: URLs of MaxBytes each in base64.
func TestLimitsMaxSourceBytes(t *testing.T) {
	l := media.Limits{MaxBytes: 300, MaxImages: 2}
	if got, want := l.MaxSourceBytes(), int64(2*(400+128)); got != want {
		t.Errorf("MaxSourceBytes = %d, want %d", got, want)
	}
}
