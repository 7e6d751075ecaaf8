package llm

import (
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
		if (e.pool != nil) == off {
			t.Errorf("NoThreadPool %v: pool attached %v", off, e.pool != nil)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
