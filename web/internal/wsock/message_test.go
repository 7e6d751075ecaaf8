package wsock_test

import (
	"errors"
	"testing"

	"github.com/parley-chat/parley/web/internal/wsock"
)

// budget is a Budget of limit bytes for every client together.
type budget struct{ limit, used int64 }

var errFull = errors.New("full")

func (b *budget) Take(_ string, n int64) error {
	if b.used+n > b.limit {
		return errFull
	}
	b.used += n
	return nil
}

func (b *budget) Give(_ string, n int64) { b.used -= n }

// A Hold takes from its budget, moves bytes into the holds it splits off (taking only what it lacks), leaves itself
// as it was on a refusal, and gives back every byte it holds.
func TestHold(t *testing.T) {
	b := &budget{limit: 100}
	h := wsock.NewHold(b, "c")
	if err := h.Grow(60); err != nil || h.Bytes() != 60 || b.used != 60 {
		t.Fatalf("grow: %v, holds %d, budget %d", err, h.Bytes(), b.used)
	}
	part, err := h.Split(40) // all from h
	if err != nil || part.Bytes() != 40 || h.Bytes() != 20 || b.used != 60 {
		t.Fatalf("split within: %v, %d and %d, budget %d", err, part.Bytes(), h.Bytes(), b.used)
	}
	more, err := h.Split(50) // 20 from h, 30 taken
	if err != nil || more.Bytes() != 50 || h.Bytes() != 0 || b.used != 90 {
		t.Fatalf("split past: %v, %d and %d, budget %d", err, more.Bytes(), h.Bytes(), b.used)
	}
	if err := h.Grow(5); err != nil {
		t.Fatal(err)
	}
	if none, err := h.Split(50); !errors.Is(err, errFull) || none.Bytes() != 0 || h.Bytes() != 5 || b.used != 95 {
		t.Fatalf("split refused: %v, %d and %d, budget %d", err, none.Bytes(), h.Bytes(), b.used)
	}
	for _, x := range []*wsock.Hold{&h, &part, &more, &part} {
		x.Release()
	}
	if b.used != 0 {
		t.Fatalf("released: budget %d", b.used)
	}
	var zero wsock.Hold // no budget: holds nothing, refuses nothing
	if err := zero.Grow(1 << 40); err != nil || zero.Bytes() != 0 {
		t.Fatalf("zero hold: %v %d", err, zero.Bytes())
	}
	zero.Release()
}

// A socket's caps: read whole when nothing may pass what a message holds without the budget; else read to twice
// its cap before the connection closes (a message past its cap is refused and the connection lives on).
func TestCapsReadLimit(t *testing.T) {
	for _, tc := range []struct {
		caps wsock.Caps
		want int64
	}{
		{wsock.Caps{Plain: 64, Free: 64}, 64},
		{wsock.Caps{Plain: 64, Max: 32, Free: 64}, 64},
		{wsock.Caps{Plain: 64, Max: 100, Free: 64}, 200},
		{wsock.Caps{Plain: 4096, Max: 5000, Free: 64}, 10000},
		{wsock.Caps{Plain: 4096, Free: 64}, 8192},
	} {
		if got := tc.caps.ReadLimit(); got != tc.want {
			t.Errorf("%+v: read limit %d, want %d", tc.caps, got, tc.want)
		}
	}
}
