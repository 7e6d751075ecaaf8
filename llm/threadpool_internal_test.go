package llm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
)

// TestThreadPoolAttached: Open attaches a persistent pool to the context
// (the binding's struct is the mirrored one), and NoThreadPool leaves none.
func TestThreadPoolAttached(t *testing.T) {
	for _, off := range []bool{false, true} {
		e, err := Open(Config{Path: testmodel.Path(t), Threads: 2, Parallel: 1, ContextLength: 128, NoThreadPool: off})
		if err != nil {
			t.Fatal(err)
		}
		if (e.be.(*embedded).pool != nil) == off {
			t.Errorf("NoThreadPool %v: pool attached %v", off, e.be.(*embedded).pool != nil)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStateSeqSaveRestore: a slot's KV state saved from one sequence and
// restored into another lets the second continue exactly as the first
// would: the same greedy next token from the restored cells.
func TestStateSeqSaveRestore(t *testing.T) {
	eachEngine(t, testStateSeqSaveRestore)
}

// eachEngine runs f as a subtest on each engine (the embedded one only
// with PARLEY_SKIP_CURRENT_ENGINE=1).
func eachEngine(t *testing.T, f func(t *testing.T, engine string)) {
	for _, name := range []string{EngineEmbedded, EngineCurrent} {
		if name == EngineCurrent && os.Getenv("PARLEY_SKIP_CURRENT_ENGINE") == "1" {
			continue
		}
		t.Run(name, func(t *testing.T) { f(t, name) })
	}
}

// testLibDir is the current engine's libraries for the package's internal
// tests: $PARLEY_ENGINE_LIB, else make setup's lib/llama-current.
func testLibDir() string {
	if lib := os.Getenv("PARLEY_ENGINE_LIB"); lib != "" {
		return lib
	}
	wd, _ := os.Getwd()
	return filepath.Join(filepath.Dir(wd), "lib", "llama-current")
}

func testStateSeqSaveRestore(t *testing.T, engine string) {
	e, err := Open(Config{Path: testmodel.Path(t), Threads: 1, Parallel: 2, ContextLength: 128, Engine: engine, LibDir: testLibDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	be := e.be
	toks, err := be.Tokenize("Once upon a time, there was", true, true)
	if err != nil {
		t.Fatal(err)
	}
	// The engine's loop owns the context while it runs: stop it first.
	e.closeOnce.Do(func() { e.closeMu.Lock(); e.closed = true; close(e.closing); e.closeMu.Unlock() })
	<-e.done
	b := newBatch(128)
	next := func(seq int, prompt []int) int {
		b.clear()
		for i, tok := range prompt {
			b.add(tok, i, seq, i == len(prompt)-1)
		}
		if err := be.Decode(b); err != nil {
			t.Fatal(err)
		}
		return argmax(be.Logits(b.numTokens() - 1))
	}
	want := next(0, toks)
	state, err := be.StateSeqSave(0)
	if err != nil || len(state) == 0 {
		t.Fatalf("save: %v, %d bytes", err, len(state))
	}
	if err := be.StateSeqRestore(1, state); err != nil {
		t.Fatal(err)
	}
	// Sequence 1 now holds the prompt: decoding its next token after the
	// prompt's last must match sequence 0 doing the same.
	b.clear()
	b.add(want, len(toks), 0, true)
	b.add(want, len(toks), 1, true)
	if err := be.Decode(b); err != nil {
		t.Fatal(err)
	}
	a, c := argmax(be.Logits(0)), argmax(be.Logits(1))
	if a != c {
		t.Errorf("after restore: sequence 1 predicts %d, sequence 0 %d", c, a)
	}
}
