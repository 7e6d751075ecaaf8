package kvcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// DirTier is a Tier in a directory that every replica mounts (NFS, a
// shared volume): one file per key, in a folder per identity, in the
// format of file.go, replaced atomically (a temporary file renamed over
// it), so a reader on any replica sees a whole state or none. There is no
// index to share: a key's file name is a hash of it, its tokens are in its
// header, and its last use is its modification time (Get touches it). The
// budget is kept by whichever replica writes: after each write it lists the
// folder (the other replicas write too, so no count of its own would do)
// and removes the least recently used files past the budget. A listing is
// a stat per file, on the cache's writer, never the decode loop.
type DirTier struct {
	dir    string
	budget int64
	log    *zap.Logger

	mu    sync.Mutex
	usage map[string]dirUsage // by identity folder: as last listed
}

type dirUsage struct {
	bytes   int64
	entries int
}

// OpenDirTier returns a DirTier in dir (created if need be) that keeps
// each identity's files within budget bytes.
func OpenDirTier(dir string, budget int64, log *zap.Logger) (*DirTier, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("kv shared dir: want a byte budget above 0, got %d", budget)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kv shared dir: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &DirTier{dir: dir, budget: budget, log: log, usage: map[string]dirUsage{}}, nil
}

func (d *DirTier) String() string { return "dir " + d.dir }

// folder is identity's folder, as the local cache names it.
func (d *DirTier) folder(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return filepath.Join(d.dir, hex.EncodeToString(sum[:8]))
}

// path is the file of key: a hash of it, so no key (a user's scope, a
// session id) appears in a name and none escapes the folder.
func (d *DirTier) path(identity, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(d.folder(identity), hex.EncodeToString(sum[:16])+".kv")
}

// Put writes e's file and keeps the folder within the budget.
func (d *DirTier) Put(_ context.Context, identity string, e *Entry) (int64, error) {
	data := Encode(identity, e)
	n := int64(len(data))
	if n > d.budget {
		return 0, fmt.Errorf("%w: a state of %d bytes, the budget is %d", ErrTierFull, n, d.budget)
	}
	folder := d.folder(identity)
	if err := os.MkdirAll(folder, 0o700); err != nil {
		return 0, err
	}
	path := d.path(identity, e.Key)
	for {
		err := writeAtomic(folder, path, data)
		if err == nil {
			break
		}
		if !noSpace(err) {
			return 0, err
		}
		// The volume is full: the oldest files give way, then it is tried
		// again; with none of them left, the tier is full.
		if d.evict(folder, path, 0) == 0 {
			return 0, fmt.Errorf("%w: %v", ErrTierFull, err)
		}
	}
	d.evict(folder, path, d.budget)
	return n, nil
}

// evict lists folder and removes the least recently used files (never
// keep) until the rest hold at most budget bytes, or one file when budget
// is 0; it records the usage it leaves and returns how many it removed.
func (d *DirTier) evict(folder, keep string, budget int64) int {
	type file struct {
		path string
		size int64
		mod  time.Time
	}
	ents, err := os.ReadDir(folder)
	if err != nil {
		return 0
	}
	var files []file
	var total int64
	for _, de := range ents {
		p := filepath.Join(folder, de.Name())
		info, err := de.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		if strings.HasSuffix(de.Name(), ".part") && time.Since(info.ModTime()) > time.Hour {
			os.Remove(p) // a write a crash interrupted (a live one renames within seconds)
			continue
		}
		if !strings.HasSuffix(de.Name(), ".kv") {
			continue
		}
		files = append(files, file{p, info.Size(), info.ModTime()})
		total += info.Size()
	}
	sort.Slice(files, func(i, j int) bool { return files[i].mod.Before(files[j].mod) })
	removed := 0
	for _, f := range files {
		if (budget > 0 && total <= budget) || (budget == 0 && removed == 1) {
			break
		}
		if f.path == keep {
			continue
		}
		if err := os.Remove(f.path); err == nil || errors.Is(err, os.ErrNotExist) {
			total -= f.size
			removed++
		}
	}
	d.mu.Lock()
	d.usage[folder] = dirUsage{bytes: total, entries: len(files) - removed}
	d.mu.Unlock()
	return removed
}

// Get reads and checks key's file and marks it used.
func (d *DirTier) Get(_ context.Context, identity, key string) (*Entry, error) {
	path := d.path(identity, key)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	e, err := Decode(data, identity, key)
	if err != nil {
		d.log.Warn("kv shared file refused; the conversation is evaluated again", zap.String("file", filepath.Base(path)), zap.Error(err))
		os.Remove(path)
		return nil, err
	}
	now := time.Now()
	_ = os.Chtimes(path, now, now) // its place in the least recently used order
	return e, nil
}

// Tokens reads the header of key's file.
func (d *DirTier) Tokens(_ context.Context, identity, key string) ([]int, error) {
	f, err := os.Open(d.path(identity, key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, _, err := readHeader(io.LimitReader(f, maxHeaderBytes))
	if err != nil {
		return nil, err
	}
	if h.identity != identity || h.key != key {
		return nil, ErrForeign
	}
	return h.tokens, nil
}

// Usage returns the folder's bytes and files as last listed.
func (d *DirTier) Usage(identity string) (int64, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[d.folder(identity)]
	return u.bytes, u.entries
}

// maxHeaderBytes bounds a header: its fields at their bounds.
const maxHeaderBytes = 8 + 4 + maxIdentity + 4 + maxKey + 4 + 4*maxTokens + 8

// writeAtomic writes data to path through a temporary file in dir, synced
// and renamed over path.
func writeAtomic(dir, path string, data []byte) error {
	f, err := os.CreateTemp(dir, "tmp-*.part")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The file's time is its place in the least recently used order:
		// the clock's own, finer than the filesystem's coarse stamp.
		now := time.Now()
		err = os.Chtimes(tmp, now, now)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// Close does nothing: a DirTier holds no open file between calls.
func (d *DirTier) Close() error { return nil }
