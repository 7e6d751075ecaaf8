package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/parley-chat/parley/llm"
)

// explainLoadFailure adds to a model load that failed creating its context
// (llama.cpp says only "failed to initialize model", most often for want of
// memory) what the model needed by the engine's estimate, what memory was
// free, and which flags lower it. Other errors are returned as they are.
func explainLoadFailure(err error, lcfg llm.Config, cfg config) error {
	if err == nil || !strings.Contains(err.Error(), "create context") {
		return err
	}
	_, est, ierr := llm.Inspect(lcfg)
	if ierr != nil {
		return err
	}
	mib := func(b int64) int64 { return b >> 20 }
	msg := fmt.Sprintf("the model needs about %d MiB (%s)", mib(est.Total()), est)
	if free, ok := freeMemory(); ok {
		msg += fmt.Sprintf(" and about %d MiB was free", mib(free))
	}
	return fmt.Errorf("%w: %s; the KV cache grows with --ctx (%d) x --parallel (%d) (--cache-slots when larger): lower them, or halve it with --kv-cache-type q8_0 --flash-attn on",
		err, msg, cfg.ctx, cfg.parallel)
}

// freeMemory is the memory a load may still take: /proc/meminfo's
// MemAvailable, or less when a cgroup (v2) caps the process, or when an
// address-space limit (ulimit -v) leaves less room in the process.
func freeMemory() (int64, bool) {
	free, ok := memAvailable("/proc/meminfo")
	if limit, used, cok := cgroupMemory("/sys/fs/cgroup"); cok && (!ok || limit-used < free) {
		free, ok = max(limit-used, 0), true
	}
	if left, aok := addressSpaceLeft("/proc/self/status"); aok && (!ok || left < free) {
		free, ok = left, true
	}
	return free, ok
}

// addressSpaceLeft is what RLIMIT_AS leaves of the process's address
// space beyond its size now (/proc/self/status's VmSize); false when there
// is no such limit.
func addressSpaceLeft(status string) (int64, bool) {
	var lim syscall.Rlimit
	// RLIM_INFINITY is all ones: any value past 2^62 is no limit.
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &lim); err != nil || lim.Cur > 1<<62 {
		return 0, false
	}
	size, ok := statusKB(status, "VmSize:")
	if !ok {
		return 0, false
	}
	return max(int64(lim.Cur)-size, 0), true
}

func memAvailable(path string) (int64, bool) { return statusKB(path, "MemAvailable:") }

// statusKB reads the line of a /proc file (meminfo, status) that starts
// with key, a size in kB, as bytes.
func statusKB(path, key string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// cgroupMemory reads a cgroup v2 folder's memory.max and memory.current;
// false when there is no cap ("max") or no such files.
func cgroupMemory(dir string) (limit, used int64, ok bool) {
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(dir + "/" + name)
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n, err == nil
	}
	limit, ok1 := read("memory.max")
	used, ok2 := read("memory.current")
	return limit, used, ok1 && ok2
}
