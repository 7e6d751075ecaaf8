package chatsocket

import (
	"testing"
	"time"
)

// TestRateLimiter: a burst of n is allowed, then events at the refill rate
// (n per window), never more.
func TestRateLimiter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name    string
		n       int
		at      []time.Duration // offsets from t0
		allowed []bool
	}{
		{"burst of n", 3, []time.Duration{0, 0, 0, 0}, []bool{true, true, true, false}},
		{"refills one per window/n", 3, []time.Duration{0, 0, 0, 19 * time.Second, 20 * time.Second, 21 * time.Second}, []bool{true, true, true, false, true, false}},
		{"a whole window refills the burst", 2, []time.Duration{0, 0, 0, time.Minute, time.Minute, time.Minute}, []bool{true, true, false, true, true, false}},
		{"never more than the burst after idling", 2, []time.Duration{0, time.Hour, time.Hour, time.Hour}, []bool{true, true, true, false}},
		{"time going backwards refills nothing", 1, []time.Duration{time.Minute, 0, 0}, []bool{true, false, false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRateLimiter(c.n, time.Minute)
			for i, d := range c.at {
				if got := r.allow(t0.Add(d)); got != c.allowed[i] {
					t.Fatalf("event %d at +%v: allowed %v, want %v", i, d, got, c.allowed[i])
				}
			}
		})
	}
}
