package llm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testmodel"
)

// TestAnonMappings: only private, writable, anonymous mappings are taken
// (not files, the brk heap or a stack); named anonymous ones are.
func TestAnonMappings(t *testing.T) {
	maps := []byte(`55d0c0000000-55d0c0100000 r-xp 00000000 fd:01 123 /usr/bin/parley
55d0c1000000-55d0c2000000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0002000000 rw-p 00000000 00:00 0
7f0002000000-7f0002001000 ---p 00000000 00:00 0
7f0003000000-7f0004000000 rw-p 00000000 00:00 0 [anon: glibc: malloc]
7f0005000000-7f0006000000 r--p 00000000 fd:01 99 /models/m.gguf
7f0006000000-7f0007000000 rw-s 00000000 00:05 7 /dev/shm/x
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
c000000000-c004000000 rw-p 00000000 00:00 0
`)
	got := anonMappings(maps)
	want := []mapping{{0x7f0000000000, 0x7f0002000000}, {0x7f0003000000, 0x7f0004000000}, {0xc000000000, 0xc004000000}}
	if !slices.Equal(got, want) {
		t.Errorf("anonMappings = %x, want %x", got, want)
	}
}

// TestNewWeightMappings: a mapping is taken when it is new, large enough
// for weights and not the one that holds the Go heap.
func TestNewWeightMappings(t *testing.T) {
	old := mapping{0x7f0000000000, 0x7f0010000000}
	small := mapping{0x7f0020000000, 0x7f0020000000 + minWeightMapping - 4096}
	weights := mapping{0x7f0030000000, 0x7f0038000000}
	grown := mapping{0xc000000000, 0xc008000000} // the Go heap, grown during the load
	// The kernel merged new weights into the mapping before them, and another
	// new mapping into the one after: only the new parts are taken.
	kv := mapping{0x7f0040000000, 0x7f0041000000}
	merged := mapping{kv.start, kv.end + 0x4000000}
	cache := mapping{0x7f0050000000, 0x7f0051000000}
	mergedBefore := mapping{cache.start - 0x2000000, cache.end}
	before := []mapping{old, kv, cache, {0xc000000000, 0xc004000000}}
	after := []mapping{old, small, weights, grown, merged, mergedBefore}
	got := newWeightMappings(before, after, 0xc000001000)
	want := []mapping{weights, {kv.end, merged.end}, {mergedBefore.start, cache.start}}
	if !slices.Equal(got, want) {
		t.Errorf("newWeightMappings = %x, want %x", got, want)
	}
	lo, hi := hugeRange(mapping{0x7f0000001000, 0x7f0000601000})
	if lo != 0x7f0000200000 || hi != 0x7f0000600000 {
		t.Errorf("hugeRange = %x-%x", lo, hi)
	}
	if lo, hi := hugeRange(mapping{0x7f0000001000, 0x7f0000101000}); lo != hi {
		t.Errorf("hugeRange of less than a huge page = %x-%x, want empty", lo, hi)
	}
}

// TestBigBlocksAreMappings: once the malloc thresholds are fixed for
// weights, a block of weights' size is a mapping of its own even right
// after a larger one was freed (which raises glibc's own threshold past it,
// so that the block would come from an arena, inside an older mapping).
func TestBigBlocksAreMappings(t *testing.T) {
	mallocForWeights()
	// Under glibc's largest moving threshold (32 MiB), and as large as
	// that allows: the less likely a free chunk that large is left in an
	// arena by the tests before.
	const freed, size = 31 << 20, 30 << 20
	for i := range 3 {
		freeBlock(cBlock(freed))
		b := cBlock(size)
		mapped := isMapped(b)
		freeBlock(b)
		if !mapped {
			t.Errorf("round %d: a block of %d bytes is not a mapping of its own", i, size)
		}
	}
}

// TestPlanHugePages: off, a GPU, and a kernel without the feature (or with
// it set to never) keep the file mapped, each saying why but off.
func TestPlanHugePages(t *testing.T) {
	dir := t.TempDir()
	setting := func(s string) {
		thpSettingPath = filepath.Join(dir, "enabled")
		if err := os.WriteFile(thpSettingPath, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	defer func(p string) { thpSettingPath = p }(thpSettingPath)
	for _, c := range []struct {
		setting, mode string
		onCPU         bool
		size          int64
		on            bool
		why           bool
	}{
		{"always [madvise] never\n", HugePagesAuto, true, 1 << 20, true, false},
		{"[always] madvise never\n", HugePagesAuto, true, 1 << 20, true, false},
		{"always madvise [never]\n", HugePagesAuto, true, 1 << 20, false, true},
		{"", HugePagesAuto, true, 1 << 20, false, true},
		{"always [madvise] never\n", HugePagesOff, true, 1 << 20, false, false},
		{"always [madvise] never\n", HugePagesAuto, false, 1 << 20, false, true},
		{"always [madvise] never\n", HugePagesAuto, true, 1 << 60, false, true}, // more than the machine's memory
	} {
		setting(c.setting)
		on, why := planHugePages(c.mode, c.onCPU, c.size)
		if on != c.on || (why != "") != c.why {
			t.Errorf("%q %s cpu=%v size=%d: %v %q", c.setting, c.mode, c.onCPU, c.size, on, why)
		}
	}
}

// TestWeightsOnHugePages loads a synthetic model of 56 MB on each engine
// with and without huge pages: the same greedy reply either way, and with
// them the context's KV cache is advised too and the weights' mappings end
// up on 2 MiB pages (where the kernel has
// transparent huge pages and MADV_COLLAPSE). It runs after other tests
// have loaded and freed models in the same process, which is what left the
// weights without a new mapping before the malloc thresholds were fixed
// (TestBigBlocksAreMappings).
func TestWeightsOnHugePages(t *testing.T) {
	spec := synth.DefaultSpec()
	spec.VocabFrom = testmodel.Path(t)
	spec.Layers, spec.Dim, spec.Heads, spec.KVHeads, spec.FFN = 8, 512, 8, 8, 1536
	path := filepath.Join(t.TempDir(), "huge.gguf")
	if _, err := synth.Write(context.Background(), path, spec); err != nil {
		t.Fatal(err)
	}
	thp := thpSetting() == "always" || thpSetting() == "madvise"
	eachEngine(t, func(t *testing.T, engine string) {
		var replies [][]int
		for _, mode := range []string{HugePagesOff, HugePagesAuto} {
			// 4 slots of 2,048 tokens: a KV cache of 134 MB, 34 MB a slot (the
			// current engine allocates each slot's apart, and each is above
			// glibc's 32 MiB cap too), which is advised as well.
			hg := advisedBytes(t)
			e, err := Open(Config{Path: path, Threads: 2, Parallel: 4, ContextLength: 2048, Engine: engine, LibDir: testLibDir(), HugePages: mode})
			if err != nil {
				t.Fatal(err)
			}
			hg = advisedBytes(t) - hg
			advised := e.Info().Device.HugePagesBytes
			var c *collapser
			switch be := e.be.(type) {
			case *embedded:
				c = be.huge
			case *current:
				c = be.huge
			}
			switch {
			case mode == HugePagesOff && (advised != 0 || c != nil):
				t.Errorf("off: %d bytes advised", advised)
			case mode == HugePagesAuto && thp && (advised < 40<<20 || c == nil):
				t.Errorf("auto: %d bytes advised, want the weights' (about 54 MB)", advised)
			case mode == HugePagesOff && hg != 0:
				t.Errorf("off: %d bytes newly advised onto huge pages", hg)
			case mode == HugePagesAuto && thp && hg < int64(advised)+120<<20:
				t.Errorf("auto: %d bytes newly advised onto huge pages, want the weights' %d and a 134 MB KV cache", hg, advised)
			case c != nil:
				<-c.done
				t.Logf("advised %d, on huge pages %d", advised, c.huge)
				if c.huge == 0 {
					t.Logf("advised %d bytes; none collapsed onto huge pages (a kernel before 6.1 has no MADV_COLLAPSE)", advised)
				} else if c.huge > advised {
					t.Errorf("%d bytes on huge pages, more than the %d advised", c.huge, advised)
				}
			}
			p := parley.DefaultParams()
			p.Temperature, p.RepeatPenalty, p.MaxTokens = 0, 1, 24
			replies = append(replies, replyIDs(t, e, "Once upon a time", p))
			e.Close()
		}
		if len(replies[0]) == 0 || !slices.Equal(replies[0], replies[1]) {
			t.Errorf("greedy replies differ: mapped %v, on huge pages %v", replies[0], replies[1])
		}
	})
}

// advisedBytes is the size of this process's mappings advised onto huge
// pages (VmFlags hg in /proc/self/smaps).
func advisedBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var total, size int64
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Size:"); ok {
			size = int64(kiB(rest))
		}
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok && slices.Contains(strings.Fields(rest), "hg") {
			total += size
		}
	}
	return total
}
