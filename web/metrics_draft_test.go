package web_test

import (
	"net/http"
	"testing"

	"github.com/parley-chat/parley/web"
)

// TestDraftCounts: a reply that repeats its prompt, with speculative
// decoding on, reports its draft tokens in its timings (llama-server's
// draft_n and draft_n_accepted), and /metrics counts them by model:
// drafted = accepted + rejected = the replies' sums.
func TestDraftCounts(t *testing.T) {
	s := openStack(t, stackOpts{maxTokens: 24, maxTokensCap: 480, draft: "ngram", options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info),
			web.WithInfo(func() web.Info { return web.Info{ModelInfo: s.engine.Info()} })}
	}})
	model := s.engine.Info().Name
	type timed struct {
		Timings *struct {
			DraftN         *int `json:"draft_n"`
			DraftNAccepted *int `json:"draft_n_accepted"`
		} `json:"timings"`
	}
	drafted, accepted := 0, 0
	for _, prompt := range []string{
		"Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom",
		"Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time, there was a little girl named Lily. She",
	} {
		var c timed
		decodeBody(t, post(t, s.base+"/v1/completions", map[string]any{"model": "x", "prompt": prompt, "max_tokens": 60, "temperature": 0}), http.StatusOK, &c)
		if c.Timings == nil || c.Timings.DraftN == nil || *c.Timings.DraftN == 0 {
			t.Fatalf("%q: timings %+v: the reply repeats its prompt, so it should have drafted", prompt, c.Timings)
		}
		n, a := *c.Timings.DraftN, 0
		if c.Timings.DraftNAccepted != nil {
			a = *c.Timings.DraftNAccepted
		}
		if a > n {
			t.Fatalf("%q: %d of %d draft tokens held", prompt, a, n)
		}
		drafted, accepted = drafted+n, accepted+a
	}
	if accepted == 0 {
		t.Errorf("no draft token held in %d", drafted)
	}
	m := scrape(t, s.base)
	for name, want := range map[string]int{
		"parley_draft_tokens_total":          drafted,
		"parley_draft_tokens_accepted_total": accepted,
		"parley_draft_tokens_rejected_total": drafted - accepted,
	} {
		if got := m.value(t, name, "model", model); got != float64(want) {
			t.Errorf("%s{model=%q} = %v, want %d", name, model, got, want)
		}
	}
	if st := s.engine.Stats(); st.DraftTokens != int64(drafted) || st.DraftAccepted != int64(accepted) {
		t.Errorf("engine counted %d drafted, %d held; the replies %d, %d", st.DraftTokens, st.DraftAccepted, drafted, accepted)
	}
}
