package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/session"
)

// Defaults of --kv-cache-ram and --kv-cache-disk.
const (
	defaultKVCacheRAM  = 512 << 20
	defaultKVCacheDisk = 2 << 30
)

// byteSize is a flag of a size in bytes: a number with an optional unit
// (KiB, MiB, GiB, TiB, or KB, MB, GB, TB in powers of 1000).
type byteSize int64

// String is the size in the largest binary unit that divides it (512MiB),
// else in bytes.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n > 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(strings.ToLower(num), strings.ToLower(u.suffix)) {
			num, mult = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n < 0 || n*float64(mult) > 1<<62 {
		return fmt.Errorf("want a size such as 512MiB, 2GiB or 0, got %q", s)
	}
	*b = byteSize(n * float64(mult))
	return nil
}

// kvCacheFlags declares the KV swap's flags.
func kvCacheFlags(fs *flag.FlagSet, c *config) {
	c.kvCacheRAM, c.kvCacheDisk = defaultKVCacheRAM, -1
	fs.Var(&c.kvCacheRAM, "kv-cache-ram", "memory for the KV state of conversations whose slot went to another session, restored on their next turn instead of evaluated again (least recently used out first; 0 = off); e.g. 512MiB, 2GiB")
	fs.Var(&c.kvCacheDisk, "kv-cache-disk", "disk space under --data-dir/kvcache for the same states, kept across restarts (least recently used out first; 0 = off); default 2GiB, off with --store memory")
	c.kvCacheMinFree = -1
	fs.Var(&c.kvCacheMinFree, "kv-cache-min-free", "free space the KV state files leave on --data-dir's disk: below it the oldest give way and new states stay in RAM; default 64MiB, plus the store's byte budget with --store bolt")
}

// kvMinFreeMargin is the default free-space floor of the KV state files
// beyond the bbolt store's budget: room for the store's file to grow in
// steps, the logs, and whatever else shares the disk.
const kvMinFreeMargin = 64 << 20

// kvMinFree is --kv-cache-min-free, or by default kvMinFreeMargin plus,
// with bbolt in the same folder, the store's byte budget as configured
// (--max-store-bytes, else the default): the states never take the room the
// store was promised.
func kvMinFree(cfg config) int64 {
	if cfg.kvCacheMinFree >= 0 {
		return int64(cfg.kvCacheMinFree)
	}
	floor := int64(kvMinFreeMargin)
	if cfg.store == "bolt" {
		switch {
		case cfg.maxStoreBytes > 0:
			floor += cfg.maxStoreBytes
		case cfg.maxStoreBytes == 0:
			floor += session.DefaultMaxStoreBytes
		}
	}
	return floor
}

// kvCacheConfig is the engine's KV swap configuration from the flags.
func kvCacheConfig(cfg config) llm.KVCacheConfig {
	disk := int64(cfg.kvCacheDisk)
	if disk < 0 { // not set
		disk = defaultKVCacheDisk
		if cfg.store == "memory" {
			disk = 0 // sessions do not outlive the process: neither need their states
		}
	}
	// A state outlives its session by at most the session's TTL: past it
	// nobody will ask for it again.
	return llm.KVCacheConfig{RAMBytes: int64(cfg.kvCacheRAM), DiskBytes: disk, Dir: filepath.Join(cfg.dataDir, "kvcache"),
		MinFreeBytes: kvMinFree(cfg), MaxAge: max(cfg.sessionTTL, 0)}
}
