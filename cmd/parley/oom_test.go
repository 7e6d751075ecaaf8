package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
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

// TestOutOfMemoryLoadSaysWhatItNeeded: a load that really runs out of
// memory, the binary under an address-space limit (prlimit --as, the
// limit a test can set without root) a little above what it takes idle,
// with a KV cache several times that: the server exits with the engine's
// estimate, the room the limit left (not the machine's free memory) and
// the flags that lower it, on whichever engine runs (on the CPU: a GPU
// would hold the cache outside the limit).
func TestOutOfMemoryLoadSaysWhatItNeeded(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("no prlimit (util-linux)")
	}
	bin := testbin.Parley(t)
	dir := t.TempDir()
	// 12 layers of 2 KV heads of 64: 6 KiB of F16 KV cache per token, 3 GiB
	// for --ctx 2048 x --parallel 256.
	model := synthModel(t, dir, "kv-heavy", 12, 256)

	// The limit: what the server takes idle, plus 512 MiB.
	idle := start(t, bin, "--store", "memory")
	size, ok := statusKB(fmt.Sprintf("/proc/%d/status", idle.Cmd.Process.Pid), "VmSize:")
	if !ok {
		t.Fatal("no VmSize")
	}
	idle.Kill()
	limit := size + 512<<20

	args := []string{"--as=" + strconv.FormatInt(limit, 10), bin, "--model", model, "--addr", freeAddr(t),
		"--threads", "1", "--ctx", "2048", "--parallel", "256", "--gpu-layers", "0", "--store", "memory", "--log-format", "json"}
	cmd := exec.Command(prlimit, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("want the load to fail, got %v:\n%s", err, out)
	}
	m := regexp.MustCompile(`the model needs about (\d+) MiB \(file .* KV cache .*\) and about (\d+) MiB was free; the KV cache grows with --ctx \(2048\) x --parallel \(256\).*--kv-cache-type q8_0`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the failure does not say what the load needed, what was free and which flags lower it:\n%s", out)
	}
	need, _ := strconv.ParseInt(string(m[1]), 10, 64)
	free, _ := strconv.ParseInt(string(m[2]), 10, 64)
	// The room is the limit's, less what the process had mapped: under the
	// limit, and less than the load needed.
	if need < 1024 || free >= limit>>20 || free >= need {
		t.Fatalf("needed %d MiB, %d MiB free under an address-space limit of %d MiB:\n%s", need, free, limit>>20, out)
	}
	t.Logf("needed %d MiB, %d MiB free under an address-space limit of %d MiB", need, free, limit>>20)
}
