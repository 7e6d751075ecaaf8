package llm_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// TestPreemptForNewcomer: while one client's two long replies hold both
// slots, another client's request is served at once (one of the first
// client's sequences steps out and comes back), not after one of those
// replies ends; the reply that stepped out goes on exactly as the one that
// did not (same prompt, greedy). With a spare cache slot the newcomer takes
// it and the victim's cache stays; without one the victim's KV state is
// copied out and put back when it goes on, or, where the state cannot be
// copied, the victim evaluates its history again. Everything is counted by events: the long replies end only
// when cancelled, after the newcomer's reply has ended.
func TestPreemptForNewcomer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cacheSlots int
		noCopies   bool
		swaps      int64 // states copied out and back
	}{
		{"swap", 2, false, 1},
		{"recompute", 2, true, 0},
		{"spare-slot", 3, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := llm.Config{ContextLength: 2048, BatchSize: 2048, Parallel: 2, CacheSlots: tc.cacheSlots}
			if tc.noCopies {
				cfg = llm.WithoutStateCopies(cfg)
			}
			e := mustOpen(t, cfg)
			toks, _ := e.Tokenize("Once upon a time")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			// Two replies that end only when cancelled, read as they come.
			type stream struct {
				mu   sync.Mutex
				ids  []int
				more chan struct{} // a token arrived
				done bool
			}
			var hs [2]*stream
			var wg sync.WaitGroup
			for i := range hs {
				ch, err := e.Generate(ctx, parley.GenerateRequest{Tokens: toks, Params: greedy(1900), Client: "heavy"})
				if err != nil {
					t.Fatal(err)
				}
				h := &stream{more: make(chan struct{}, 1)}
				hs[i] = h
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ev := range ch {
						h.mu.Lock()
						if ev.Done {
							h.done = true
						} else {
							h.ids = append(h.ids, ev.Token.ID)
						}
						h.mu.Unlock()
						select {
						case h.more <- struct{}{}:
						default:
						}
					}
				}()
			}
			waitTokens := func(h *stream, n int) {
				t.Helper()
				for {
					h.mu.Lock()
					got, done := len(h.ids), h.done
					h.mu.Unlock()
					if got >= n {
						return
					}
					if done {
						t.Fatalf("a long reply ended after %d tokens", got)
					}
					<-h.more
				}
			}
			for _, h := range hs {
				waitTokens(h, 1) // both slots generate
			}

			// Another prompt than the long replies': a slot the newcomer
			// leaves holds no part of their history.
			ltoks, _ := e.Tokenize("Tom and his dog")
			lch, err := e.Generate(context.Background(), parley.GenerateRequest{Tokens: ltoks, Params: greedy(8), Client: "light"})
			if err != nil {
				t.Fatal(err)
			}
			l := collect(t, lch)
			if l.final.Err != nil || len(l.ids) == 0 {
				t.Fatalf("the newcomer's reply: %v, %d tokens", l.final.Err, len(l.ids))
			}
			at := make([]int, len(hs))
			for i, h := range hs {
				h.mu.Lock()
				if h.done {
					t.Fatalf("long reply %d ended before the newcomer's: the newcomer waited for it", i)
				}
				at[i] = len(h.ids)
				h.mu.Unlock()
			}
			if n := e.Stats().Preemptions; n != 1 {
				t.Fatalf("%d preemptions, want 1", n)
			}
			// Both go on past that point, then end.
			for i, h := range hs {
				waitTokens(h, at[i]+32)
			}
			cancel()
			wg.Wait()
			a, b := hs[0].ids, hs[1].ids
			n := min(len(a), len(b))
			if !slices.Equal(a[:n], b[:n]) {
				i := 0
				for a[i] == b[i] {
					i++
				}
				t.Fatalf("the replies differ at token %d of %d (stepped out after %v tokens)", i, n, at)
			}
			st := e.Stats()
			if st.SlotsBusy != 0 || st.Queued != 0 {
				t.Fatalf("after: %d slots busy, %d queued", st.SlotsBusy, st.Queued)
			}
			if st.PreemptSwapOuts != tc.swaps || st.PreemptSwapIns != tc.swaps {
				t.Fatalf("states copied out %d, put back %d; want %d each", st.PreemptSwapOuts, st.PreemptSwapIns, tc.swaps)
			}
		})
	}
}
