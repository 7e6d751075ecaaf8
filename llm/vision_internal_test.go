package llm

import (
	"math"
	"testing"

	"github.com/parley-chat/parley"
)

func TestImageIDs(t *testing.T) {
	a, b := [32]byte{1, 2, 3, 4}, [32]byte{1, 2, 3, 5}
	ia, ib := imageIDs(a, 600, 600), imageIDs(b, 600, 600)
	seen := map[int]bool{}
	for i, id := range ia {
		if id >= parley.ImageToken || id < math.MinInt32 {
			t.Fatalf("id %d: %d is not below ImageToken within int32 (the KV swap's files hold int32)", i, id)
		}
		seen[id] = true
	}
	if len(seen) != 600 {
		t.Errorf("%d distinct ids in a run of 600", len(seen))
	}
	if ia[0] == ib[0] || imageIDs(a, 600, 600)[599] != ia[599] {
		t.Errorf("ids are not a function of the key: %d %d", ia[0], ib[0])
	}
	// The top of the 30 bits wraps to the bottom, staying negative.
	top := [32]byte{0xff, 0xff, 0xff, 0x3f}
	if ids := imageIDs(top, 2, 2); ids[0] != -2-(1<<30-1) || ids[1] != -2 {
		t.Errorf("wrapped run %v", ids)
	}
}

// A slot's cache is never trimmed inside an image run: keep backs off to the run's start.
func TestImageBoundary(t *testing.T) {
	run := imageIDs([32]byte{9}, 4, 4)
	runs := map[int]*imageRun{run[0]: {n: 4}}
	toks := append(append([]int{1, 2}, run...), 3, 4)
	for keep, want := range map[int]int{0: 0, 1: 1, 2: 2, 3: 2, 4: 2, 5: 2, 6: 6, 7: 7, 8: 8} {
		if got := imageBoundary(toks, keep, runs); got != want {
			t.Errorf("keep %d: %d, want %d", keep, got, want)
		}
	}
}

// An M-RoPE image of 9 embeddings at 3 positions: its first 3 ids take a position, the other 6 none, all within
// int32 and apart from every id that takes one; a token list maps each entry to its KV position from its ids alone,
// and a model without M-RoPE images keeps positions equal to indexes.
func TestImagePositions(t *testing.T) {
	for _, key := range [][32]byte{{9}, {0xff, 0xff, 0xff, 0x3f}} {
		ids := imageIDs(key, 9, 3)
		seen := map[int]bool{}
		for i, id := range ids {
			if id >= parley.ImageToken || id < math.MinInt32 || takesPosition(id) != (i < 3) {
				t.Fatalf("key %x, id %d: %d (takes a position: %v)", key[:4], i, id, takesPosition(id))
			}
			seen[id] = true
		}
		if len(seen) != 9 {
			t.Errorf("key %x: %d distinct ids in a run of 9", key[:4], len(seen))
		}
		if llava := imageIDs(key, 9, 9); llava[0] != ids[0] || !takesPosition(llava[8]) {
			t.Errorf("key %x: a run without M-RoPE %v", key[:4], llava)
		}
	}
	run := imageIDs([32]byte{9}, 9, 3)
	toks := append(append([]int{1, 2}, run...), 3, 4)
	mrope := &Engine{vision: &vision{mrope: true}}
	want := map[int]int{0: 0, 2: 2, 3: 3, 11: 5, 12: 6, 13: 7}
	for i, p := range want {
		if got := mrope.posAt(toks, i); got != p {
			t.Errorf("M-RoPE: entry %d at position %d, want %d", i, got, p)
		}
	}
	plain := &Engine{}
	if got := plain.posAt(toks, 13); got != 13 {
		t.Errorf("without M-RoPE: entry 13 at position %d", got)
	}
}
