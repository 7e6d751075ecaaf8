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
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// DirTier is a Tier in a directory that every replica mounts (NFS, a
// shared volume): one file per key, in a folder per identity, in the
// format of file.go, replaced atomically (a temporary file renamed over
// it), so a reader on any replica sees a whole state or none. There is no
// index to share: a key's file name is a hash of its owner (the user,
// parley.ScopeOwner) and a hash of the key, its tokens are in its header,
// and its last use is its modification time (Get touches it). The budget is
// kept by whichever replica writes: after each write it lists the folder
// (the other replicas write too, so no count of its own would do) and
// removes files past the budget, each the least recently used of the owner
// who holds the most bytes. A listing is a stat per file, on the cache's
// writer, never the decode loop.
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

// path is the file of key: a hash of its owner, a dash and a hash of the
// key, so no key (a user's scope, a session id) appears in a name, none
// escapes the folder, and a listing tells each owner's files.
func (d *DirTier) path(identity, key string) string {
	owner := sha256.Sum256([]byte(parley.ScopeOwner(key)))
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(d.folder(identity), hex.EncodeToString(owner[:8])+"-"+hex.EncodeToString(sum[:16])+".kv")
}

// fileOwner is the owner part of a file's name (path); "" for a name
// without one.
func fileOwner(name string) string {
	owner, _, ok := strings.Cut(name, "-")
	if !ok {
		return ""
	}
	return owner
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

// evict lists folder and removes files (never keep) until the rest hold at
// most budget bytes, or one file when budget is 0: each time the least
// recently used file of the owner who holds the most bytes, so a user's
// writes evict another's files only while that one holds more. It records
// the usage it leaves and returns how many it removed.
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
	// Each owner's files, least recently used first, and their bytes.
	byOwner := map[string][]file{}
	held := map[string]int64{}
	for _, f := range files {
		o := fileOwner(filepath.Base(f.path))
		byOwner[o] = append(byOwner[o], f)
		held[o] += f.size
	}
	removed := 0
	for (budget > 0 && total > budget) || (budget == 0 && removed == 0) {
		// The owner who holds the most bytes and has a file to give.
		victim, from := file{}, ""
		for o, fs := range byOwner {
			for _, f := range fs {
				if f.path != keep {
					if victim.path == "" || held[o] > held[from] || (held[o] == held[from] && o < from) {
						victim, from = f, o
					}
					break
				}
			}
		}
		if victim.path == "" {
			break
		}
		byOwner[from] = slices.DeleteFunc(byOwner[from], func(f file) bool { return f.path == victim.path })
		held[from] -= victim.size
		if err := os.Remove(victim.path); err == nil || errors.Is(err, os.ErrNotExist) {
			total -= victim.size
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
