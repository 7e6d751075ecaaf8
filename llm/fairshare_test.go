package llm_test

import (
	"context"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// TestFairShareBetweenClients: with the one slot held by one client and
// more of its requests waiting, another client's request is served next but
// one (round robin between clients), not behind the whole queue; and one
// client cannot fill the queue for everyone. The order is read from the
// engine's own timings (one slot: replies run one after another), not from
// when a goroutine happened to see a token.
func TestFairShareBetweenClients(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 2048, Parallel: 1, QueueSize: 8})
	toks, _ := e.Tokenize("Once upon a time")
	bg := context.Background()

	// heavy holds the slot with a reply that ends only when cancelled.
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	holder, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: greedy(1900), Client: "heavy"})
	if err != nil {
		t.Fatal(err)
	}
	<-holder // generating: it holds the slot
	// heavy may have QueueSize/2 + Parallel = 5 waiting: five are taken,
	// the sixth is refused (busy, with Retry-After), while light still
	// gets in.
	var waiting []<-chan parley.Event
	for i := range 5 {
		ch, err := e.Generate(bg, parley.GenerateRequest{Tokens: toks, Params: greedy(48), Client: "heavy"})
		if err != nil {
			t.Fatalf("heavy's waiting request %d refused: %v", i+1, err)
		}
		waiting = append(waiting, ch)
	}
	_, err = e.Generate(bg, parley.GenerateRequest{Tokens: toks, Params: greedy(4), Client: "heavy"})
	if parley.ErrorCode(err) != parley.EBusy || parley.RetryAfter(err) <= 0 {
		t.Fatalf("heavy past its share of the queue: %v, want busy with Retry-After", err)
	}
	lch, err := e.Generate(bg, parley.GenerateRequest{Tokens: toks, Params: greedy(48), Client: "light"})
	if err != nil {
		t.Fatalf("light refused while heavy fills its share: %v", err)
	}

	cancel()
	collect(t, holder)
	l := collect(t, lch)
	var hs []result
	for _, ch := range waiting {
		hs = append(hs, collect(t, ch))
	}
	// Round robin: heavy's first waiting reply, then light's, then heavy's
	// others. Light's whole reply (submitted after all of heavy's) ran
	// before heavy's second waiting one started, so that one waited at
	// least as long as light's reply took from its submission; first come
	// first served would have run all five of heavy's first.
	for i, h := range hs[1:] {
		if h.final.Timings.Queued < l.final.Timings.Total {
			t.Fatalf("heavy's waiting reply %d started %v after its submission, before light's (submitted later) ended %v after its own: light was not served in turn",
				i+2, h.final.Timings.Queued, l.final.Timings.Total)
		}
	}
	if hs[0].final.Timings.Queued >= l.final.Timings.Total+hs[0].final.Timings.Total {
		t.Logf("heavy's first waiting reply started after light's: allowed, light is next either way")
	}
}
