package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
)

// TestLoadFailureSaysWhatItNeeded: a context that could not be created (what
// llama.cpp reports when memory runs out) is explained with the engine's
// estimate, the free memory and the flags that lower it; other errors are
// left as they are. (A real out-of-memory load needs a memory cap this test
// does not set up: the message is built from the same estimate.)
func TestLoadFailureSaysWhatItNeeded(t *testing.T) {
	cfg := config{ctx: 2048, parallel: 64, kvCacheType: "f16", batch: 512}
	lcfg := engineConfig(cfg, testmodel.Path(t), nil)
	lcfg.ContextLength, lcfg.Parallel, lcfg.CacheSlots = cfg.ctx, cfg.parallel, cfg.parallel
	base := errors.New("create context: failed to initialize model")
	err := explainLoadFailure(base, lcfg, cfg)
	t.Log(err)
	if !errors.Is(err, base) {
		t.Fatalf("the cause is lost: %v", err)
	}
	for _, want := range []string{"needs about", "KV cache", "MiB was free", "--ctx (2048) x --parallel (64)", "--kv-cache-type q8_0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	other := errors.New("open model: no such file")
	if got := explainLoadFailure(other, lcfg, cfg); got != other {
		t.Fatalf("another error changed: %v", got)
	}
}

func TestFreeMemoryReadsCgroupAndMeminfo(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "meminfo"), []byte("MemTotal: 100 kB\nMemAvailable:    2048 kB\n"), 0o644)
	if n, ok := memAvailable(filepath.Join(dir, "meminfo")); !ok || n != 2048<<10 {
		t.Fatalf("MemAvailable = %d %v", n, ok)
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("3221225472\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("1073741824\n"), 0o644)
	if l, u, ok := cgroupMemory(dir); !ok || l-u != 2<<30 {
		t.Fatalf("cgroup %d - %d %v", l, u, ok)
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("max\n"), 0o644)
	if _, _, ok := cgroupMemory(dir); ok {
		t.Fatal("no cap read as one")
	}
}
