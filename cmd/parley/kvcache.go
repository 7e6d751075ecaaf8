package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/llm/kvcache"
	"github.com/parley-chat/parley/llm/kvcache/kvredis"
	"github.com/parley-chat/parley/session"
)

// Defaults of --kv-cache-ram, --kv-cache-disk and --kv-cache-shared-bytes.
const (
	defaultKVCacheRAM    = 512 << 20
	defaultKVCacheDisk   = 2 << 30
	defaultKVSharedBytes = 4 << 30
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
	fs.StringVar(&c.kvShared, "kv-cache-shared", "", "a store every replica reaches for the same states, in place of --kv-cache-disk: redis://HOST:PORT/DB (or rediss://) or a folder on a shared volume (an absolute path: NFS, a mounted volume); any replica then resumes a conversation another served, warm, and resent (stateless) conversations are kept there too. A store that is full or down costs the turns that move their warm start, never an error")
	c.kvSharedBytes = defaultKVSharedBytes
	fs.Var(&c.kvSharedBytes, "kv-cache-shared-bytes", "bytes of states --kv-cache-shared keeps per model (least recently used out first, whichever replica wrote them); e.g. 4GiB")
	fs.BoolVar(&c.kvSharedWait, "kv-cache-shared-wait", true, "a reply ends (its last event, the sentinel) once its state is in --kv-cache-shared, so a replica killed after a reply loses none of it; false: the state follows the reply's end within milliseconds")
}

// kvTier is a shared tier that the process closes.
type kvTier interface {
	kvcache.Tier
	io.Closer
}

// openKVTier opens --kv-cache-shared (nil without it). A Redis that does not
// answer now is no error: the tier tries again on use.
func openKVTier(ctx context.Context, cfg config, log *zap.Logger) (kvTier, error) {
	switch {
	case cfg.kvShared == "":
		return nil, nil
	case cfg.kvSharedBytes <= 0:
		return nil, fmt.Errorf("--kv-cache-shared-bytes: want a size above 0 with --kv-cache-shared")
	case strings.HasPrefix(cfg.kvShared, "redis://"), strings.HasPrefix(cfg.kvShared, "rediss://"):
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		t, err := kvredis.Open(pctx, cfg.kvShared, "parley:kv:", int64(cfg.kvSharedBytes), log.Named("kvshared"))
		if err != nil {
			return nil, fmt.Errorf("--kv-cache-shared: %w", err)
		}
		return t, nil
	case filepath.IsAbs(cfg.kvShared):
		t, err := kvcache.OpenDirTier(cfg.kvShared, int64(cfg.kvSharedBytes), log.Named("kvshared"))
		if err != nil {
			return nil, fmt.Errorf("--kv-cache-shared: %w", err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("--kv-cache-shared: want redis://HOST:PORT/DB, rediss://... or an absolute path, got %q", cfg.kvShared)
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
		MinFreeBytes: kvMinFree(cfg), MaxAge: max(cfg.sessionTTL, 0), Shared: cfg.kvTier,
		SharedWait: cfg.kvSharedWait}
}
