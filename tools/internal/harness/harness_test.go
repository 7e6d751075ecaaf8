package harness_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/tools/internal/harness"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 20; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, time.Millisecond}, {50, 10 * time.Millisecond}, {95, 19 * time.Millisecond}, {100, 20 * time.Millisecond}} {
		if got := harness.Percentile(ds, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if harness.Percentile(nil, 50) != 0 {
		t.Error("no samples: want 0")
	}
	if ds[0] != time.Millisecond {
		t.Error("Percentile sorted its argument")
	}
}

func TestOneClientLoad(t *testing.T) {
	got := strings.Join(harness.OneClientLoad(100), " ")
	for _, want := range []string{"--max-conns-per-ip 100", "--max-http-conns-per-ip 264", "--max-sessions-per-client 0", "--client-store-share 1"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}

// TestStartRefusesAProgramThatExits: a binary that exits at once is an
// error, not a wait until the deadline.
func TestStartRefusesAProgramThatExits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := harness.Start(ctx, "/bin/false", nil, nil, nil); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("want an exit error, got %v", err)
	}
}

func TestInts(t *testing.T) {
	got, err := harness.Ints("1, 2,8")
	if err != nil || len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 8 {
		t.Errorf("Ints(\"1, 2,8\") = %v, %v", got, err)
	}
	for _, bad := range []string{"", "1,,2", "1,x", "2.5"} {
		if got, err := harness.Ints(bad); err == nil {
			t.Errorf("Ints(%q) = %v, want an error", bad, got)
		}
	}
}

// TestStartLlamaServerRefusesAProgramThatExits: as Start, for llama-server.
func TestStartLlamaServerRefusesAProgramThatExits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := harness.StartLlamaServer(ctx, "/bin/false", nil, nil); err == nil || !strings.Contains(err.Error(), "llama-server exited") {
		t.Fatalf("want an exit error, got %v", err)
	}
}
