// Package kvcache keeps the KV state of conversations that left their
// llama.cpp slot: a bounded RAM cache, least recently used out first, in
// front of a bounded directory of files that survives restarts. An entry is
// one session's sequence state (the bytes llama_state_seq_get_data wrote)
// with the exact tokens it holds, so the engine can restore it into any slot
// and evaluate only the tokens that follow.
//
// It is pure Go and knows nothing of llama.cpp: the engine copies states in
// and out. Every file carries the identity of what wrote it (the model, the
// llama.cpp build, the KV layout: Config.Identity) and a checksum; a file
// that is truncated, corrupt or of another identity is refused (and
// removed), never handed back.
package kvcache

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// writeQueue bounds the states waiting to be written to disk. A save that
// finds it full is kept in RAM only (counted in Stats.DiskDropped): the
// decode loop never waits for the disk.
const writeQueue = 16

// ErrNotFound is returned by Get for a key with no entry.
var ErrNotFound = errors.New("kvcache: no entry")

// Config configures a Cache.
type Config struct {
	// Dir is where files are kept (in a folder of their own per Identity);
	// "" keeps entries in RAM only.
	Dir string
	// RAMBytes bounds the states held in memory; 0 holds none.
	RAMBytes int64
	// DiskBytes bounds the files in Dir's folder for this Identity; 0
	// writes none.
	DiskBytes int64
	// Identity names what the states are valid for: the model, the
	// llama.cpp build and the KV cache's layout. An entry of another
	// identity is never returned.
	Identity string
	Logger   *zap.Logger
	// MinFreeBytes is the free space the files leave on Dir's filesystem:
	// a file that would take it below the floor is written only once this
	// cache's own least recently used files have made room, and not at all
	// when they cannot (the state stays in RAM). The same holds at Open,
	// and when a write fails for want of space (ENOSPC, EDQUOT) whatever
	// the floor says. Other files there (the session store's) are never
	// touched: their room is what the floor keeps. 0: no floor.
	MinFreeBytes int64
	// MaxAge removes at Open the files, of every identity under Dir, not
	// used for longer (their sessions have expired; a folder of a model or
	// build no longer served has no other way out). 0 keeps them.
	MaxAge time.Duration
	// FreeBytes returns the space free for this process on dir's
	// filesystem; nil: statfs. For tests.
	FreeBytes func(dir string) (int64, error)
	// Shared, when set, is the tier below RAM in place of Dir: a store
	// every replica reaches (tier.go). Dir, DiskBytes, MinFreeBytes and
	// MaxAge are then unused: the tier keeps its own budget.
	Shared Tier
}

// Entry is one session's saved state. Immutable once saved.
type Entry struct {
	Key    string
	Tokens []int  // the tokens whose keys and values State holds, in position order
	State  []byte // llama_state_seq_get_data's bytes
	// RAMOnly keeps the entry in RAM and never writes it to disk: a
	// stateless conversation's, which no stored session will ask for
	// after a restart.
	RAMOnly bool
}

func (e *Entry) size() int64 { return int64(len(e.State) + 4*len(e.Tokens)) }

// Stats is a snapshot of a Cache's counters (cumulative) and sizes (now).
type Stats struct {
	Saves, SavedBytes           int64 // entries saved (RAM, disk or both)
	DiskWrites, DiskWriteBytes  int64 // files written
	DiskWriteErrors             int64 // files that could not be written
	DiskDropped                 int64 // saves not written because the queue was full
	DiskPending                 int   // saves queued for disk, not written yet (now)
	DiskLoads, DiskLoadNanos    int64 // files read back, and the time it took
	Corrupt, Foreign            int64 // files refused (and removed): truncated or corrupt, of another identity
	RAMEvictions, DiskEvictions int64 // entries dropped for room (the budget, or the disk's free space)
	DiskFull                    int64 // saves not written: the disk had no room above MinFreeBytes, even without this cache's files
	Pruned                      int64 // files removed at Open for their age (MaxAge)
	// The shared tier (Config.Shared): states written, their bytes, writes
	// that failed (the tier down) or found no room; states read and the
	// time it took; reads that failed (the tier down).
	SharedWrites, SharedWriteBytes, SharedWriteErrors, SharedFull int64
	SharedLoads, SharedLoadNanos, SharedReadErrors                int64
	SharedBytes                                                   int64 // held by the tier for this identity, as last seen
	SharedEntries                                                 int
	RAMBytes, DiskBytes                                           int64 // held now
	RAMEntries, DiskEntries                                       int   // held now
}

// Cache is safe for concurrent use.
type Cache struct {
	cfg Config
	dir string // Dir's folder for Identity; "" without a disk
	log *zap.Logger

	mu       sync.Mutex
	ram      map[string]*list.Element // of *Entry
	ramLRU   list.List                // front: most recently used
	ramBytes int64
	pending  map[string]*Entry        // queued for disk, not written yet
	disk     map[string]*list.Element // of *diskEntry
	diskLRU  list.List
	diskSize int64

	writes chan queued
	done   chan struct{}
	closed atomic.Bool

	saves, savedBytes, diskWrites, diskWriteBytes, diskWriteErrors, diskDropped atomic.Int64
	diskLoads, diskLoadNanos, corrupt, foreign, ramEvictions, diskEvictions     atomic.Int64
	diskFull, pruned                                                            atomic.Int64
	full                                                                        bool // the last write found no room (logged once until one succeeds); owned by the writer

	// The shared tier's counters, its health (tierUp, tierDown, tierFull:
	// each change is logged once) and the time (Unix ns) until which it is
	// left alone after a failure.
	sharedWrites, sharedWriteBytes, sharedWriteErrors, sharedFull atomic.Int64
	sharedLoads, sharedLoadNanos, sharedReadErrors                atomic.Int64
	health                                                        atomic.Int32
	downUntil                                                     atomic.Int64
	// readAt is when each key's entry in RAM was read from the shared
	// tier (under mu): GetFor takes it without asking the tier again
	// within tierFresh.
	readAt map[string]time.Time
}

// queued is an entry waiting for the writer, and what to call once it is
// written, refused or dropped (nil: nothing).
type queued struct {
	e       *Entry
	written func()
}

type diskEntry struct {
	key    string
	name   string
	size   int64
	tokens []int
}

// Open returns a Cache. With a directory and a disk budget, it creates the
// identity's folder, removes what a crash left half-written, indexes the
// files there (their headers only) and starts the writer.
func Open(cfg Config) (*Cache, error) {
	c := &Cache{cfg: cfg, log: cfg.Logger, ram: map[string]*list.Element{}, pending: map[string]*Entry{}, disk: map[string]*list.Element{},
		readAt: map[string]time.Time{}}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if cfg.Shared != nil {
		c.writes, c.done = make(chan queued, writeQueue), make(chan struct{})
		go c.writer()
		return c, nil
	}
	if cfg.Dir != "" && cfg.DiskBytes > 0 {
		sum := sha256.Sum256([]byte(cfg.Identity))
		c.dir = filepath.Join(cfg.Dir, hex.EncodeToString(sum[:8]))
		if err := os.MkdirAll(c.dir, 0o700); err != nil {
			return nil, fmt.Errorf("kv cache dir: %w", err)
		}
		c.prune()
		c.scan()
		c.mu.Lock()
		if !c.makeRoom(0) {
			c.log.Warn("kv cache: the disk is below its free-space floor; states are kept in RAM until it has room",
				zap.String("dir", c.dir), zap.Int64("min_free_bytes", cfg.MinFreeBytes))
		}
		c.mu.Unlock()
		c.writes, c.done = make(chan queued, writeQueue), make(chan struct{})
		go c.writer()
	}
	return c, nil
}

// Close stops the writer after it has written what was queued.
func (c *Cache) Close() {
	if c.writes == nil || !c.closed.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	close(c.writes)
	c.mu.Unlock()
	<-c.done
}

// Put saves e for its key, replacing what the key had: into RAM when it
// fits the RAM budget, and queued for disk when it fits the disk budget.
// It never waits for the disk.
func (c *Cache) Put(e *Entry) { c.PutThen(e, nil) }

// PutThen is Put, and calls written (unless nil) once the lower tier has
// e, or will not have it: after the writer's write (or its failure), at
// once when e is not queued (RAM only, no lower tier, the queue full,
// closed), when a newer save of its key replaces it in the queue. written
// must not block: it runs on the writer, or on Put's caller.
func (c *Cache) PutThen(e *Entry, written func()) {
	if !c.put(e, written) && written != nil {
		written()
	}
}

// put is PutThen; it reports whether e is queued (the writer calls written).
func (c *Cache) put(e *Entry, written func()) bool {
	c.saves.Add(1)
	c.savedBytes.Add(int64(len(e.State)))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ramRemove(e.Key)
	if e.size() <= c.cfg.RAMBytes {
		c.ram[e.Key] = c.ramLRU.PushFront(e)
		c.ramBytes += e.size()
		c.ramEvict()
	}
	if c.writes == nil || e.RAMOnly || c.closed.Load() || (c.cfg.Shared == nil && e.size() > c.cfg.DiskBytes) {
		return false
	}
	select {
	case c.writes <- queued{e, written}:
		c.pending[e.Key] = e
		return true
	default:
		c.diskDropped.Add(1)
		if c.pending[e.Key] != nil {
			// An older state is still queued: it must not land after this one is lost.
			delete(c.pending, e.Key)
		}
		return false
	}
}

// Get returns the entry of key: from RAM, the write queue, or disk. A file
// that fails its checks is removed and its error returned (ErrCorrupt,
// ErrForeign, or the read's); ErrNotFound when key has none.
func (c *Cache) Get(key string) (*Entry, error) {
	c.mu.Lock()
	if el, ok := c.ram[key]; ok {
		c.ramLRU.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*Entry), nil
	}
	if e, ok := c.pending[key]; ok {
		c.mu.Unlock()
		return e, nil
	}
	el, ok := c.disk[key]
	c.mu.Unlock()
	if !ok {
		return nil, ErrNotFound
	}
	de := el.Value.(*diskEntry)
	path := filepath.Join(c.dir, de.name)
	t0 := time.Now()
	h, state, err := readFile(path, c.cfg.Identity)
	if err == nil && h.key != key {
		err = ErrForeign // a file renamed or copied in from another session
	}
	if err != nil {
		c.refuse(de, err)
		return nil, err
	}
	c.diskLoads.Add(1)
	c.diskLoadNanos.Add(int64(time.Since(t0)))
	now := time.Now()
	_ = os.Chtimes(path, now, now) // its place in the disk LRU after a restart
	e := &Entry{Key: key, Tokens: h.tokens, State: state}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.disk[key]; ok && cur == el {
		c.diskLRU.MoveToFront(el)
	}
	if _, ok := c.ram[key]; !ok && e.size() <= c.cfg.RAMBytes {
		c.ram[key] = c.ramLRU.PushFront(e)
		c.ramBytes += e.size()
		c.ramEvict()
	}
	return e, nil
}

// GetMemory returns the entry of key when it is in RAM or queued for the
// disk, never reading a file (nil otherwise). For the decode loop.
func (c *Cache) GetMemory(key string) *Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.ram[key]; ok {
		c.ramLRU.MoveToFront(el)
		return el.Value.(*Entry)
	}
	return c.pending[key]
}

// Peek reports whether key has an entry, without loading it.
func (c *Cache) Peek(key string) bool { return c.Tokens(key) != nil }

// Tokens returns the tokens of key's entry (nil when it has none), without
// loading its state; with a shared tier, the longer of this process's and
// the tier's (a lookup there). When this process has none, the tier's entry
// is read whole and kept in RAM: the caller asks in order to restore it
// (the chat layer builds the prompt from the tokens, then the engine
// fetches the state), and GetFor then finds it without another round trip
// (tierFresh). The caller must not change them.
func (c *Cache) Tokens(key string) []int {
	local := c.localTokens(key)
	if c.cfg.Shared == nil {
		return local
	}
	if local == nil {
		if e, err := c.sharedGet(key); err == nil {
			return e.Tokens
		}
		return nil
	}
	if shared, err := c.sharedTokens(key); err == nil && len(shared) > len(local) {
		return shared
	}
	return local
}

// localTokens is Tokens without the shared tier.
func (c *Cache) localTokens(key string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pending[key]; ok {
		return e.Tokens
	}
	if el, ok := c.ram[key]; ok {
		return el.Value.(*Entry).Tokens
	}
	if el, ok := c.disk[key]; ok {
		return el.Value.(*diskEntry).tokens
	}
	return nil
}

// refuse removes a file that failed its checks (unless a newer one
// replaced it meanwhile) and counts it.
func (c *Cache) refuse(de *diskEntry, err error) {
	switch {
	case errors.Is(err, ErrForeign):
		c.foreign.Add(1)
	case errors.Is(err, ErrCorrupt):
		c.corrupt.Add(1)
	}
	c.log.Warn("kv cache file refused; the conversation is evaluated again", zap.String("key", de.key),
		zap.String("file", de.name), zap.Error(err))
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.disk[de.key]; ok && el.Value.(*diskEntry) == de {
		c.diskRemove(el)
	}
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	st := Stats{RAMBytes: c.ramBytes, RAMEntries: len(c.ram), DiskBytes: c.diskSize, DiskEntries: len(c.disk), DiskPending: len(c.pending)}
	c.mu.Unlock()
	st.Saves, st.SavedBytes = c.saves.Load(), c.savedBytes.Load()
	st.DiskWrites, st.DiskWriteBytes, st.DiskWriteErrors = c.diskWrites.Load(), c.diskWriteBytes.Load(), c.diskWriteErrors.Load()
	st.DiskDropped, st.DiskLoads, st.DiskLoadNanos = c.diskDropped.Load(), c.diskLoads.Load(), c.diskLoadNanos.Load()
	st.Corrupt, st.Foreign = c.corrupt.Load(), c.foreign.Load()
	st.RAMEvictions, st.DiskEvictions = c.ramEvictions.Load(), c.diskEvictions.Load()
	st.DiskFull, st.Pruned = c.diskFull.Load(), c.pruned.Load()
	st.SharedWrites, st.SharedWriteBytes, st.SharedWriteErrors = c.sharedWrites.Load(), c.sharedWriteBytes.Load(), c.sharedWriteErrors.Load()
	st.SharedFull, st.SharedLoads, st.SharedLoadNanos = c.sharedFull.Load(), c.sharedLoads.Load(), c.sharedLoadNanos.Load()
	st.SharedReadErrors = c.sharedReadErrors.Load()
	if c.cfg.Shared != nil {
		st.SharedBytes, st.SharedEntries = c.cfg.Shared.Usage(c.cfg.Identity)
	}
	return st
}

// ramRemove drops key's RAM entry. c.mu is held.
func (c *Cache) ramRemove(key string) {
	delete(c.readAt, key)
	if el, ok := c.ram[key]; ok {
		c.ramBytes -= el.Value.(*Entry).size()
		c.ramLRU.Remove(el)
		delete(c.ram, key)
	}
}

// ramEvict drops the least recently used entries past the budget. c.mu is held.
func (c *Cache) ramEvict() {
	for c.ramBytes > c.cfg.RAMBytes {
		el := c.ramLRU.Back()
		c.ramRemove(el.Value.(*Entry).Key)
		c.ramEvictions.Add(1)
	}
}

// fileName is the name of an entry's file: a hash of the identity, the key
// and the exact tokens.
func fileName(identity, key string, tokens []int) string {
	h := sha256.New()
	for _, s := range []string{identity, key} {
		_ = binary.Write(h, binary.LittleEndian, uint32(len(s)))
		h.Write([]byte(s))
	}
	for _, t := range tokens {
		_ = binary.Write(h, binary.LittleEndian, int32(t))
	}
	return hex.EncodeToString(h.Sum(nil)[:16]) + ".kv"
}

// writer writes queued entries until Close.
func (c *Cache) writer() {
	defer close(c.done)
	for q := range c.writes {
		c.writeOne(q.e)
		if q.written != nil {
			q.written()
		}
	}
}

// writeOne writes a queued entry to the lower tier. Called by the writer.
func (c *Cache) writeOne(e *Entry) {
	c.mu.Lock()
	current := c.pending[e.Key] == e
	c.mu.Unlock()
	if !current {
		return // replaced by a newer save (queued behind it) or dropped
	}
	if c.cfg.Shared != nil {
		c.writeShared(e)
		c.mu.Lock()
		if c.pending[e.Key] == e {
			delete(c.pending, e.Key)
		}
		c.mu.Unlock()
		return
	}
	name := fileName(c.cfg.Identity, e.Key, e.Tokens)
	n, err := c.write(e, name)
	c.mu.Lock()
	if c.pending[e.Key] == e {
		delete(c.pending, e.Key)
	}
	if errors.Is(err, errNoRoom) {
		c.mu.Unlock()
		c.diskFull.Add(1)
		if !c.full {
			c.full = true
			c.log.Warn("kv cache: no room on the disk above its free-space floor, even without this cache's files; states are kept in RAM until there is",
				zap.String("dir", c.dir), zap.Int64("min_free_bytes", c.cfg.MinFreeBytes))
		}
		return
	}
	if err != nil {
		c.mu.Unlock()
		c.diskWriteErrors.Add(1)
		c.log.Warn("kv cache file not written", zap.String("key", e.Key), zap.Error(err))
		return
	}
	c.full = false
	c.diskWrites.Add(1)
	c.diskWriteBytes.Add(n)
	if old, ok := c.disk[e.Key]; ok {
		if old.Value.(*diskEntry).name == name {
			c.diskSize -= old.Value.(*diskEntry).size
			c.diskLRU.Remove(old)
			delete(c.disk, e.Key)
		} else {
			c.diskRemove(old)
		}
	}
	c.disk[e.Key] = c.diskLRU.PushFront(&diskEntry{key: e.Key, name: name, size: n, tokens: e.Tokens})
	c.diskSize += n
	c.diskEvict()
	c.mu.Unlock()
}

// diskRemove drops an index entry and its file. c.mu is held.
func (c *Cache) diskRemove(el *list.Element) {
	de := el.Value.(*diskEntry)
	c.diskLRU.Remove(el)
	delete(c.disk, de.key)
	c.diskSize -= de.size
	if err := os.Remove(filepath.Join(c.dir, de.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Warn("kv cache file not removed", zap.String("file", de.name), zap.Error(err))
	}
}

// diskEvict removes the least recently used files past the budget. c.mu is held.
func (c *Cache) diskEvict() {
	for c.diskSize > c.cfg.DiskBytes && c.diskLRU.Len() > 0 {
		c.diskRemove(c.diskLRU.Back())
		c.diskEvictions.Add(1)
	}
}

// scan indexes the folder at Open: half-written files go, as do files that
// fail their header's checks and all but the newest file of each key; the
// rest are ordered by their last use (modification time) and cut to the
// budget.
func (c *Cache) scan() {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		c.log.Warn("kv cache dir not read", zap.String("dir", c.dir), zap.Error(err))
		return
	}
	type found struct {
		de  *diskEntry
		mod time.Time
	}
	byKey := map[string]found{}
	for _, d := range ents {
		path := filepath.Join(c.dir, d.Name())
		if !d.Type().IsRegular() {
			continue
		}
		if !strings.HasSuffix(d.Name(), ".kv") {
			if strings.HasSuffix(d.Name(), ".part") {
				os.Remove(path) // a write that a crash interrupted
			}
			continue
		}
		h, size, err := readFileHeader(path)
		if err == nil && h.identity != c.cfg.Identity {
			err = ErrForeign
		}
		if err != nil {
			c.refuse(&diskEntry{name: d.Name()}, err)
			os.Remove(path)
			continue
		}
		info, err := d.Info()
		if err != nil {
			continue
		}
		f := found{&diskEntry{key: h.key, name: d.Name(), size: size, tokens: h.tokens}, info.ModTime()}
		if old, ok := byKey[h.key]; ok {
			if old.mod.After(f.mod) {
				f, old = old, f
			}
			os.Remove(filepath.Join(c.dir, old.de.name))
		}
		byKey[h.key] = f
	}
	all := make([]found, 0, len(byKey))
	for _, f := range byKey {
		all = append(all, f)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod.After(all[j].mod) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range all {
		c.disk[f.de.key] = c.diskLRU.PushBack(f.de)
		c.diskSize += f.de.size
	}
	c.diskEvict()
	if len(all) > 0 {
		c.log.Info("kv cache files found", zap.String("dir", c.dir), zap.Int("entries", len(c.disk)), zap.Int64("bytes", c.diskSize))
	}
}
