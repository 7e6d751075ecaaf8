package llm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/llm/kvcache"
)

// swapConv is one session's first turn, made through the engine: its
// prompt and the tokens generated after it.
type swapConv struct {
	key    string
	prompt []int
	gen    []int
}

func firstTurn(t *testing.T, e *llm.Engine, key, text string, n int) swapConv {
	t.Helper()
	toks, err := e.Tokenize(text)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: key, Tokens: toks, Params: greedy(n)})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, ch)
	if r.final.Err != nil {
		t.Fatal(r.final.Err)
	}
	return swapConv{key: key, prompt: toks, gen: r.ids}
}

// next returns the tokens of the conversation's second prompt: the first
// prompt, the reply, then more text.
func (c swapConv) next(t *testing.T, e *llm.Engine, more string) []int {
	t.Helper()
	cont, err := e.TokenizeContinuation(more)
	if err != nil {
		t.Fatal(err)
	}
	return append(append(slices.Clone(c.prompt), c.gen...), cont...)
}

func turn(t *testing.T, e *llm.Engine, key string, toks []int, n int) result {
	t.Helper()
	ch, err := e.Generate(context.Background(), parley.GenerateRequest{Key: key, Tokens: toks, Params: greedy(n)})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, ch)
	if r.final.Err != nil {
		t.Fatal(r.final.Err)
	}
	return r
}

// Two slots, three sessions: the third takes the first one's slot, so its
// state is saved; its next turn gets the other slot (the least recently
// used), restores it there and evaluates only the new tokens, and its greedy
// reply is byte for byte the reply of an engine that evaluates the whole
// prompt. With one KV stream per slot and with one buffer shared by the
// slots (--kv-unified), on either engine.
func TestKVSwapRestoreMatchesRecompute(t *testing.T) {
	names := []string{llm.EngineEmbedded, llm.EngineCurrent}
	if os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") == "1" {
		names = names[:1]
	}
	for _, engine := range names {
		for _, unified := range []string{"off", "on"} {
			t.Run(engine+" unified "+unified, func(t *testing.T) { testRestoreMatchesRecompute(t, engine, unified) })
		}
	}
}

func testRestoreMatchesRecompute(t *testing.T, engine, unified string) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2, Threads: 1, KVUnified: unified, Engine: engine, LibDir: currentLibDir(t),
		KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20}})
	a := firstTurn(t, e, "a", "Once upon a time there was a little girl called Lily.", 60)
	firstTurn(t, e, "b", "The dog ran to the park and saw a big red ball.", 20)
	firstTurn(t, e, "c", "A big fish lived in the blue sea with his mother.", 20)

	toks := a.next(t, e, " Then Lily said")
	got := turn(t, e, "a", toks, 60)
	st := e.Stats().KVCache
	if st.Saves < 1 || st.Restores != 1 {
		t.Fatalf("saves %d, restores %d; want the first session saved and restored once", st.Saves, st.Restores)
	}
	// The whole first turn: the reply's last token, sampled and never
	// decoded, was decoded before the state was saved.
	carried := len(a.prompt) + len(a.gen)
	if c := got.final.Usage.CachedPromptTokens; c < carried {
		t.Fatalf("cached prompt tokens %d, want at least %d (the first turn's prompt and reply)", c, carried)
	}

	fresh := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1, Threads: 1, Engine: engine, LibDir: currentLibDir(t)})
	want := turn(t, fresh, "a", toks, 60)
	if want.final.Usage.CachedPromptTokens != 0 {
		t.Fatalf("the fresh engine reused %d tokens", want.final.Usage.CachedPromptTokens)
	}
	if got.text != want.text || !slices.Equal(got.ids, want.ids) {
		t.Fatalf("reply after restore differs from the reply after a full recompute:\n got %q\nwant %q", got.text, want.text)
	}
	t.Logf("restored %d tokens (state %d bytes) in %.2f ms; reply %d tokens, identical", st.RestoredTokens, st.SavedBytes,
		float64(st.RestoreNanos)/1e6, len(got.ids))
}

// With a disk budget the state survives the engine: a new engine on the
// same folder restores it on the session's next turn.
func TestKVSwapDiskSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := llm.Config{ContextLength: 512, Parallel: 2, Threads: 1, KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20, DiskBytes: 64 << 20, Dir: dir}}
	e := mustOpen(t, cfg)
	a := firstTurn(t, e, "a", "Once upon a time there was a little girl called Lily.", 60)
	toks := a.next(t, e, " Then Lily said")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e2 := mustOpen(t, cfg)
	var saved []int // before the turn, whose own state replaces it at idle
	for _, tok := range e2.SavedTokens("a") {
		saved = append(saved, tok.ID)
	}
	got := turn(t, e2, "a", toks, 40)
	st := e2.Stats().KVCache
	if st.Restores != 1 || st.DiskLoads != 1 {
		t.Fatalf("restores %d, disk loads %d; want 1 each", st.Restores, st.DiskLoads)
	}
	if c := got.final.Usage.CachedPromptTokens; c < len(a.prompt)+len(a.gen) {
		t.Fatalf("cached prompt tokens %d after the restart, want at least %d", c, len(a.prompt)+len(a.gen))
	}
	// The saved state is the whole first turn, the reply's last token
	// included (it ended at its length limit, on a token sampled and never
	// decoded), so that the chat layer's next prompt continues it.
	if len(a.gen) != 60 {
		t.Fatalf("the first reply has %d tokens, want 60 (ended at its length limit)", len(a.gen))
	}
	if want := append(slices.Clone(a.prompt), a.gen...); !slices.Equal(saved, want) {
		t.Fatalf("saved tokens %v\nwant the first turn's %v", saved, want)
	}
}

// kvFiles returns the cache's files under dir.
func kvFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.kv"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Truncated files, flipped bits and a file of another model all fall back
// to evaluating the conversation again, with the same reply.
func TestKVSwapDamagedFilesFallBack(t *testing.T) {
	// Another model: the same weights with a byte of padding after them
	// (its size, so its identity, differs).
	other := filepath.Join(t.TempDir(), "other.gguf")
	raw, err := os.ReadFile(testmodel.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, append(raw, make([]byte, 32)...), 0o600); err != nil {
		t.Fatal(err)
	}
	damage := map[string]func(t *testing.T, file, dir string){
		"truncated": func(t *testing.T, file, _ string) {
			st, _ := os.Stat(file)
			if err := os.Truncate(file, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		},
		"flipped": func(t *testing.T, file, _ string) {
			b, _ := os.ReadFile(file)
			b[len(b)*2/3] ^= 0x10
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"another model": func(t *testing.T, file, dir string) {
			// The other model's engine saves the same conversation; its
			// file replaces this model's.
			oe := mustOpen(t, llm.Config{Path: other, ContextLength: 512, Parallel: 1, Threads: 1,
				KVCache: llm.KVCacheConfig{DiskBytes: 64 << 20, Dir: filepath.Join(dir, "other")}})
			firstTurn(t, oe, "a", "Once upon a time there was a little girl called Lily.", 60)
			if err := oe.Close(); err != nil {
				t.Fatal(err)
			}
			theirs := kvFiles(t, filepath.Join(dir, "other"))
			if len(theirs) != 1 {
				t.Fatalf("other model's files: %v", theirs)
			}
			b, _ := os.ReadFile(theirs[0])
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	}
	reasons := map[string]string{"truncated": llm.FallbackCorrupt, "flipped": llm.FallbackCorrupt, "another model": llm.FallbackForeign}
	// want is the reply of every damaged case: the reply of a recompute.
	var want string
	for name, spoil := range damage {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := llm.Config{ContextLength: 512, Parallel: 1, Threads: 1, KVCache: llm.KVCacheConfig{DiskBytes: 64 << 20, Dir: dir}}
			e := mustOpen(t, cfg)
			a := firstTurn(t, e, "a", "Once upon a time there was a little girl called Lily.", 60)
			toks := a.next(t, e, " Then Lily said")
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			files := kvFiles(t, dir)
			if len(files) != 1 {
				t.Fatalf("files %v, want 1", files)
			}
			spoil(t, files[0], dir)

			e2 := mustOpen(t, cfg)
			got := turn(t, e2, "a", toks, 40)
			st := e2.Stats().KVCache
			if st.Restores != 0 || got.final.Usage.CachedPromptTokens != 0 {
				t.Fatalf("restores %d, cached %d: a damaged file was used", st.Restores, got.final.Usage.CachedPromptTokens)
			}
			// Counted as a file refused (at the scan or at the read) and,
			// when the turn found it, as the turn's fallback.
			refused := map[string]int64{llm.FallbackCorrupt: st.Corrupt, llm.FallbackForeign: st.Foreign}[reasons[name]]
			if refused != 1 {
				t.Fatalf("files refused as %s: %d, want 1 (stats %+v)", reasons[name], refused, st)
			}
			if left := kvFiles(t, dir); len(left) != 0 {
				t.Fatalf("the refused file is still there: %v", left)
			}
			t.Logf("refused as %s; turn fallbacks %v", reasons[name], st.Fallbacks)
			if want == "" {
				want = got.text
			} else if got.text != want {
				t.Fatalf("reply %q, want %q", got.text, want)
			}
		})
	}
}

// A saved state restores as far as the prompt still follows it (an edited
// reply: the rest is dropped and evaluated again), and not at all when the
// prompt no longer continues it (a reset conversation: counted as a
// mismatch). Either way the reply is a full recompute's.
func TestKVSwapPartialAndMismatch(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1, Threads: 1, KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20}})
	fresh := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1, Threads: 1})
	a := firstTurn(t, e, "a", "Once upon a time there was a little girl called Lily.", 60)
	firstTurn(t, e, "b", "The dog ran to the park and saw a big red ball.", 20)

	edited := swapConv{prompt: a.prompt, gen: a.gen[:10]}.next(t, e, " Then Tom said")
	got := turn(t, e, "a", edited, 30)
	if c, want := got.final.Usage.CachedPromptTokens, len(a.prompt)+10; c < want || c >= len(a.prompt)+len(a.gen) {
		t.Fatalf("cached %d prompt tokens of an edited history, want the %d it shares", c, want)
	}
	if want := turn(t, fresh, "x", edited, 30); got.text != want.text {
		t.Fatalf("after a partial restore: %q, recompute %q", got.text, want.text)
	}

	firstTurn(t, e, "b", "The dog ran to the park and saw a big red ball.", 20) // b's own state restored
	other, err := e.Tokenize("A big fish lived in the sea.")
	if err != nil {
		t.Fatal(err)
	}
	before := e.Stats().KVCache.Restores
	got = turn(t, e, "a", other, 30)
	st := e.Stats().KVCache
	if st.Restores != before || st.Fallbacks[llm.FallbackMismatch] != 1 || got.final.Usage.CachedPromptTokens > 1 {
		t.Fatalf("restores %d (%d before), fallbacks %v, cached %d; want no restore and one mismatch", st.Restores, before, st.Fallbacks,
			got.final.Usage.CachedPromptTokens)
	}
	if want := turn(t, fresh, "y", other, 30); got.text != want.text {
		t.Fatalf("after a mismatch: %q, recompute %q", got.text, want.text)
	}
}

// A folder that cannot be created (a file is in the way) keeps the states in
// RAM only: the engine still opens and still swaps.
func TestKVSwapUnusableFolder(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e := mustOpen(t, llm.Config{ContextLength: 512, Parallel: 1, Threads: 1,
		KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20, DiskBytes: 64 << 20, Dir: filepath.Join(blocker, "kv")}})
	a := firstTurn(t, e, "a", "Once upon a time there was a little girl called Lily.", 30)
	firstTurn(t, e, "b", "The dog ran to the park and saw a big red ball.", 10)
	turn(t, e, "a", a.next(t, e, " Then Lily said"), 10)
	if st := e.Stats().KVCache; st.Restores != 1 || st.DiskWrites != 0 {
		t.Fatalf("restores %d, disk writes %d; want a restore from RAM and no file", st.Restores, st.DiskWrites)
	}
}

// TestKVSwapWithMoreCacheSlots: with more KV-cache slots than decode slots
// (--cache-slots), a slot beyond --parallel that goes to another session has
// its state saved like any other (the swap's per-slot bookkeeping once had
// --parallel entries and panicked, taking the server down, on slot 4 of 8).
func TestKVSwapWithMoreCacheSlots(t *testing.T) {
	e := mustOpen(t, llm.Config{ContextLength: 256, Parallel: 1, CacheSlots: 2, Threads: 1,
		KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20}})
	convs := make([]swapConv, 3)
	for i, text := range []string{"Once upon a time", "The little dog", "A big red ball"} {
		convs[i] = firstTurn(t, e, fmt.Sprintf("s%d", i), text, 8) // the third takes a used slot: a save
	}
	for _, c := range convs {
		r := turn(t, e, c.key, c.next(t, e, " and then"), 4)
		if len(r.ids) == 0 {
			t.Fatalf("%s: no reply", c.key)
		}
	}
	if st := e.Stats().KVCache; st.Saves == 0 || st.Restores == 0 {
		t.Errorf("saves %d restores %d, want both", st.Saves, st.Restores)
	}
}

// With a shared tier and SharedWait, a reply's final event comes once its
// state is in the tier: another engine on the tier finds it as soon as the
// reply has ended, with no wait of its own.
func TestKVSwapSharedWait(t *testing.T) {
	dir := t.TempDir()
	open := func() *llm.Engine {
		tier, err := kvcache.OpenDirTier(dir, 64<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		return mustOpen(t, llm.Config{ContextLength: 512, Parallel: 2, Threads: 1,
			KVCache: llm.KVCacheConfig{RAMBytes: 64 << 20, Shared: tier, SharedWait: true}})
	}
	a, b := open(), open()
	c := firstTurn(t, a, "w1", "Once upon a time there was a little girl called Lily.", 20)
	saved := b.SavedTokens("w1")
	if want := len(c.prompt) + len(c.gen); len(saved) < want {
		t.Fatalf("once the reply ended, the other engine finds %d tokens of its state in the tier, want %d", len(saved), want)
	}
	if st := a.Stats().KVCache; st.Waits != 1 || st.SharedWrites != 1 {
		t.Fatalf("waits %d, shared writes %d; want the reply's end held once for its write", st.Waits, st.SharedWrites)
	}
}
