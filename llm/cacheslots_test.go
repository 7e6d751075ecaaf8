package llm_test

import (
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley/llm"
)

// TestCacheSlotsKeepMoreConversationsWarm: with CacheSlots 4 and Parallel 2,
// four conversations that share a system prompt take a turn each, four at
// once, then a second turn each: every second turn finds its first turn's
// prompt and reply in the cache. New conversations take the empty slots
// rather than the warm slot of another conversation that shares their
// system prompt (copying that prefix instead), and no more than two
// sequences decode at once. With as many slots as Parallel (the default),
// the same turns cannot all stay warm.
func TestCacheSlotsKeepMoreConversationsWarm(t *testing.T) {
	system := "System: You are a storyteller who tells short, happy stories about animals.\n\n"
	keys := []string{"a", "b", "c", "d"}
	turns := func(e *llm.Engine) (reused, firstLen []int, maxBusy int) {
		first := make([]string, len(keys))
		firstLen = make([]int, len(keys))
		for i, k := range keys {
			first[i] = system + "User: Tell me about animal " + k + ".\n\nAssistant:"
			r := generate(t, e, k, first[i], greedy(8))
			first[i] += r.text
			firstLen[i] = r.final.Usage.PromptTokens + len(r.ids) - 1 // the last sampled token is not in the cache
		}
		reused = make([]int, len(keys))
		done := make(chan struct{})
		polled := make(chan int)
		go func() { // the most slots busy at once while the second turns run
			most := 0
			for {
				most = max(most, e.Stats().SlotsBusy)
				select {
				case <-done:
					polled <- most
					return
				case <-time.After(100 * time.Microsecond):
				}
			}
		}()
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := generate(t, e, k, first[i]+"\n\nUser: And then?\n\nAssistant:", greedy(8))
				reused[i] = r.final.Usage.CachedPromptTokens
			}()
		}
		wg.Wait()
		close(done)
		return reused, firstLen, <-polled
	}

	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 2, CacheSlots: 4, Threads: 1})
	if st := e.Stats(); st.Slots != 2 || st.CacheSlots != 4 {
		t.Fatalf("%d slots, %d cache slots; want 2 and 4", st.Slots, st.CacheSlots)
	}
	reused, firstLen, busy := turns(e)
	if busy > 2 {
		t.Errorf("%d sequences decoded at once, Parallel is 2", busy)
	}
	for i := range keys {
		// The text of a reply may tokenize differently from the tokens
		// sampled, so a few of its last tokens may be evaluated again.
		if reused[i] < firstLen[i]-4 {
			t.Errorf("conversation %s: second turn reused %d tokens, want about %d (its first turn)", keys[i], reused[i], firstLen[i])
		}
	}
	if st := e.Stats(); st.PrefixCopies < 2 {
		t.Errorf("%d prefix copies: new conversations should copy the shared system prompt into empty slots", st.PrefixCopies)
	}

	small := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 2, Threads: 1})
	reused, firstLen, _ = turns(small)
	cold := 0
	for i := range keys {
		if reused[i] < firstLen[i]-4 {
			cold++
		}
	}
	if cold == 0 {
		t.Errorf("with 2 slots all 4 conversations stayed warm (reused %v of %v): the test does not test CacheSlots", reused, firstLen)
	}
}
