package llm_test

import (
	"slices"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// TestThreadPoolKeepsRepliesAndCloses: the persistent thread pool (at the
// default polling, without polling, and absent) changes only speed: greedy
// replies are token for token the same, over several concurrent slots, and
// every engine closes (freeing its pool) cleanly.
func TestThreadPoolKeepsRepliesAndCloses(t *testing.T) {
	prompts := []string{"Once upon a time", "Lily and Tom went"}
	var want [][]int
	for _, cfg := range []llm.Config{
		{NoThreadPool: true, Threads: 2, Parallel: 3, ContextLength: 256},
		{Threads: 2, Parallel: 3, ContextLength: 256},
		{Poll: -1, Threads: 2, Parallel: 3, ContextLength: 256},
		{Poll: 100, Threads: 1, Parallel: 3, ContextLength: 256},
	} {
		e := mustOpen(t, cfg)
		var got [][]int
		for i, p := range prompts {
			r := generate(t, e, "k"+p, p, greedy(12))
			if r.final.Err != nil || len(r.ids) == 0 {
				t.Fatalf("%+v: prompt %d: %v, %d tokens", cfg, i, r.final.Err, len(r.ids))
			}
			got = append(got, r.ids)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = got
			continue
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("poll %d pool %v: prompt %d: %v, want %v", cfg.Poll, !cfg.NoThreadPool, i, got[i], want[i])
			}
		}
	}
	if _, err := llm.Open(llm.Config{Path: testmodel.Path(t), Poll: 101}); err == nil {
		t.Error("poll 101 was accepted")
	}
}
