package llm_test

import (
	"fmt"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
)

// TestCacheSlotsKeepMoreConversationsWarm: with more cache slots than
// parallel ones, more conversations than generate at once keep their
// cache between turns, and a new conversation that shares only a system
// prompt with a kept one takes an empty slot (copying the prompt) rather
// than evicting it.
func TestCacheSlotsKeepMoreConversationsWarm(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1, CacheSlots: 3})
	if st := e.Stats(); st.Slots != 3 {
		t.Fatalf("%d slots, want 3", st.Slots)
	}
	system := "System: You are a kind storyteller who tells short, happy stories.\n\n"
	prompts := make([]string, 3)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("%sUser: Tell me about animal number %d.", system, i)
	}
	var firsts []result
	for i, p := range prompts {
		r := generate(t, e, fmt.Sprint("conv", i), p, greedy(8))
		firsts = append(firsts, r)
		if i > 0 && r.final.Usage.CachedPromptTokens < 10 {
			t.Fatalf("conversation %d: %d tokens cached; the system prompt is in another slot", i, r.final.Usage.CachedPromptTokens)
		}
	}
	for i, p := range prompts {
		next := p + firsts[i].text + " User: And then?"
		r := generate(t, e, fmt.Sprint("conv", i), next, greedy(8))
		seen := firsts[i].final.Usage.PromptTokens + len(firsts[i].ids)
		if got := r.final.Usage.CachedPromptTokens; got < seen-2 {
			t.Fatalf("conversation %d, second turn: %d tokens cached, want about %d (its first turn's prompt and reply)", i, got, seen)
		}
	}
	// The same prompt in a fresh engine gives the same reply: kept caches change nothing.
	fresh := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1})
	want := generate(t, fresh, "x", prompts[2]+firsts[2].text+" User: And then?", greedy(8))
	again := generate(t, e, "y", prompts[2]+firsts[2].text+" User: And then?", greedy(8))
	if want.text != again.text {
		t.Fatalf("reply %q differs from a fresh engine's %q", again.text, want.text)
	}
}

// TestCacheSlotsLimit: more cache slots than llama.cpp has sequences are refused at Open.
func TestCacheSlotsLimit(t *testing.T) {
	if _, err := llm.Open(llm.Config{Path: testmodel.Path(t), Parallel: 1, CacheSlots: llm.MaxCacheSlots + 1}); err == nil {
		t.Fatal("Open took more cache slots than llama.cpp's limit")
	}
}
