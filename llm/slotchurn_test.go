package llm_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// Slot bookkeeping meets llama.cpp's KV cache asserts, which abort the whole
// process: a prefix copied into a slot that already shares cells with its
// source (--kv-unified on) did. Many concurrent requests that share openings
// in every way (the same key coming back, new keys on an old opening,
// stateless requests, histories cut short, cancels mid-reply), with fewer
// slots than keys and the KV swap on, must all end, on both engines and both
// KV layouts, and the engine must then still reply as a fresh one does.
func TestSlotChurnNeverAborts(t *testing.T) {
	openings := []string{
		"User: Once upon a time, there was a little girl named Lily. Tell me her story.",
		"User: Once upon a time, there was a little girl named Mia. Tell me her story.",
		"System: You are a storyteller who tells short stories.\n\nUser: Once upon a time",
		"User: Hi!",
	}
	const probe = "User: Tom and Lily went to the park.\n\nAssistant:"
	for _, unified := range []string{"off", "on"} {
		for name, e := range engines(t, testmodel.Path(t), llm.Config{
			ContextLength: 256, Parallel: 2, CacheSlots: 3, Threads: 1, KVUnified: unified,
			KVCache: llm.KVCacheConfig{RAMBytes: 1 << 20}, // small: states are dropped as well as restored
		}) {
			t.Run(name+"/unified-"+unified, func(t *testing.T) {
				var wg sync.WaitGroup
				errs := make(chan error, 64)
				for w := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(w), 7))
						history := map[string]string{}
						for i := range 15 {
							key := ""
							if k := rng.IntN(6); k < 5 { // 5 keys over 3 slots, and stateless requests
								key = fmt.Sprintf("w%d-k%d", w, k)
							}
							prompt := history[key]
							switch {
							case prompt == "" || rng.IntN(5) == 0: // a new conversation, or one cut back to its opening
								prompt = openings[rng.IntN(len(openings))]
							case len(prompt) > 300: // a history cut short
								prompt = prompt[:len(prompt)/2]
							}
							prompt += fmt.Sprintf("\n\nUser: turn %d of %d.\n\nAssistant:", i, w)
							toks, err := e.Tokenize(prompt)
							if err == nil && len(toks) > 200 { // keep within the 256-token context
								prompt = openings[0] + "\n\nAssistant:"
								toks, err = e.Tokenize(prompt)
							}
							if err != nil {
								errs <- err
								return
							}
							ctx, cancel := context.WithCancel(context.Background())
							if rng.IntN(4) == 0 {
								time.AfterFunc(time.Duration(rng.IntN(3))*time.Millisecond, cancel)
							}
							p := greedy(1 + rng.IntN(12))
							ch, err := e.Generate(ctx, parley.GenerateRequest{Key: key, Tokens: toks, Params: p})
							if err != nil {
								cancel()
								errs <- fmt.Errorf("request %d of worker %d: %w", i, w, err)
								return
							}
							r := collect(t, ch)
							cancel()
							if f := r.final.Finish; f == parley.FinishError {
								errs <- fmt.Errorf("request %d of worker %d ended with an error: %v", i, w, r.final.Err)
								return
							}
							if key != "" {
								history[key] = prompt + r.text
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				// The engine is sound after the churn: a new session's greedy
				// reply is the reply of a fresh engine.
				got := generate(t, e, "after", probe, greedy(16))
				fresh := engines(t, testmodel.Path(t), llm.Config{ContextLength: 256, Parallel: 1, Threads: 1, KVUnified: unified})[name]
				want := generate(t, fresh, "after", probe, greedy(16))
				if got.text != want.text {
					t.Fatalf("after the churn %q, fresh %q", got.text, want.text)
				}
				st := e.Stats()
				if st.PrefixCopies == 0 || st.PromptReused == 0 || st.KVCache.Restores == 0 {
					t.Errorf("the churn copied %d prefixes, reused %d prompt tokens and restored %d states; want all three",
						st.PrefixCopies, st.PromptReused, st.KVCache.Restores)
				}
				t.Logf("%d prefix copies, %d prompt tokens reused, %d states restored, fallbacks %v", st.PrefixCopies, st.PromptReused, st.KVCache.Restores, st.KVCache.Fallbacks)
			})
		}
	}
}
