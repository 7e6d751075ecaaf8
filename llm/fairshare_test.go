package llm_test

import (
	"context"
	"sync"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// TestFairShareBetweenClients: with every slot held by one client and more
// of its requests waiting, another client's request is served at the next
// free slot but one (round robin between clients), not behind the whole
// queue; and one client cannot fill the queue for everyone.
func TestFairShareBetweenClients(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 2048, Parallel: 2, QueueSize: 8})
	toks, _ := e.Tokenize("Once upon a time")
	heavy := parley.WithClient(context.Background(), "heavy")
	light := parley.WithClient(context.Background(), "light")

	// heavy holds both slots with replies that end only when cancelled.
	var cancels []context.CancelFunc
	var holders []<-chan parley.Event
	for range 2 {
		ctx, cancel := context.WithCancel(heavy)
		cancels = append(cancels, cancel)
		ch, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: greedy(1900)})
		if err != nil {
			t.Fatal(err)
		}
		<-ch // generating: it holds its slot
		holders = append(holders, ch)
	}
	// Four more of heavy's wait, then one of light's.
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	follow := func(name string, ch <-chan parley.Event) {
		defer wg.Done()
		first := true
		for ev := range ch {
			if first && !ev.Done {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				first = false
			}
		}
	}
	for _, n := range []string{"h3", "h4", "h5", "h6"} {
		ch, err := e.Generate(heavy, parley.GenerateRequest{Tokens: toks, Params: greedy(4)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go follow(n, ch)
	}
	// heavy may have QueueSize/2 + Parallel = 6 waiting: two more are
	// taken, the next is refused (busy, with Retry-After), while light
	// still gets in.
	var err error
	for i := range 3 {
		var ch <-chan parley.Event
		if ch, err = e.Generate(heavy, parley.GenerateRequest{Tokens: toks, Params: greedy(4)}); err != nil {
			if i != 2 {
				t.Fatalf("heavy's waiting request %d refused: %v", 5+i, err)
			}
			break
		}
		wg.Add(1)
		go follow("h", ch)
	}
	if parley.ErrorCode(err) != parley.EBusy || parley.RetryAfter(err) <= 0 {
		t.Fatalf("heavy past its share of the queue: %v, want busy with Retry-After", err)
	}
	ch, err := e.Generate(light, parley.GenerateRequest{Tokens: toks, Params: greedy(4)})
	if err != nil {
		t.Fatalf("light refused while heavy fills its share: %v", err)
	}
	wg.Add(1)
	go follow("light", ch)

	// Free the slots one by one.
	for i, cancel := range cancels {
		cancel()
		collect(t, holders[i])
	}
	wg.Wait()
	pos := -1
	for i, n := range order {
		if n == "light" {
			pos = i
		}
	}
	// Round robin: heavy's h3 (next in turn) then light; first come first
	// served would have put light after h6.
	if pos < 0 || pos > 1 {
		t.Fatalf("start order %v: light should start second at the latest", order)
	}
	t.Logf("start order after the slots came free: %v", order)
}
