package kvcache

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// This file keeps the files within the disk's free space (Config.MinFreeBytes)
// and removes those nobody will ask for again (Config.MaxAge). The cache
// shares its filesystem with the session store: a full disk would refuse
// every user's writes there, so the cache gives way first, and only with its
// own files.

// errNoRoom is a write given up for want of space: the disk is below the
// floor (or full) even without this cache's files.
var errNoRoom = errors.New("kvcache: no room on the disk")

// write writes e's file as name once the disk has room for it above the
// floor, making that room with this cache's least recently used files; a
// write the filesystem refuses for want of space evicts the oldest file and
// is tried again, until it succeeds or no file is left (errNoRoom).
func (c *Cache) write(e *Entry, name string) (int64, error) {
	need := int64(len(e.State)) + 4*int64(len(e.Tokens)) + int64(len(e.Key)+len(c.cfg.Identity)) + 64
	c.mu.Lock()
	ok := c.makeRoom(need)
	c.mu.Unlock()
	if !ok {
		return 0, errNoRoom
	}
	for {
		n, err := writeFile(c.dir, name, header{identity: c.cfg.Identity, key: e.Key, tokens: e.Tokens}, e.State)
		if err == nil || !noSpace(err) {
			return n, err
		}
		c.mu.Lock()
		evicted := c.diskLRU.Len() > 0
		if evicted {
			c.diskRemove(c.diskLRU.Back())
			c.diskEvictions.Add(1)
		}
		c.mu.Unlock()
		if !evicted {
			return 0, errNoRoom
		}
	}
}

// makeRoom removes this cache's least recently used files until need more
// bytes leave the floor free, and reports whether they do. A free space it
// cannot read counts as room (a write that then fails for want of space
// still evicts). c.mu is held.
func (c *Cache) makeRoom(need int64) bool {
	if c.cfg.MinFreeBytes <= 0 || c.dir == "" {
		return true
	}
	for {
		free, err := c.freeBytes()
		if err != nil {
			return true
		}
		if free-need >= c.cfg.MinFreeBytes {
			return true
		}
		if c.diskLRU.Len() == 0 {
			return false
		}
		c.diskRemove(c.diskLRU.Back())
		c.diskEvictions.Add(1)
	}
}

func (c *Cache) freeBytes() (int64, error) {
	if c.cfg.FreeBytes != nil {
		return c.cfg.FreeBytes(c.dir)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(c.dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// noSpace reports whether err is the filesystem's "no space" (or quota).
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// prune removes, at Open, the files in every identity's folder under Dir
// that were not used (written or read) within MaxAge, and the folders it
// leaves empty: a model or llama.cpp build no longer served leaves its
// folder behind, which no cache would ever shrink.
func (c *Cache) prune() {
	if c.cfg.MaxAge <= 0 {
		return
	}
	folders, err := os.ReadDir(c.cfg.Dir)
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-c.cfg.MaxAge)
	removed := 0
	for _, f := range folders {
		if !f.IsDir() || !isFolderName(f.Name()) {
			continue
		}
		dir := filepath.Join(c.cfg.Dir, f.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		left := len(ents)
		for _, d := range ents {
			if !d.Type().IsRegular() || !(strings.HasSuffix(d.Name(), ".kv") || strings.HasSuffix(d.Name(), ".part")) {
				continue
			}
			info, err := d.Info()
			if err != nil || info.ModTime().After(cutoff) {
				continue
			}
			if os.Remove(filepath.Join(dir, d.Name())) == nil {
				removed++
				left--
			}
		}
		if left == 0 && dir != c.dir {
			os.Remove(dir)
		}
	}
	if removed > 0 {
		c.pruned.Add(int64(removed))
		c.log.Info("kv cache files removed for their age", zap.Int("files", removed), zap.Duration("max_age", c.cfg.MaxAge))
	}
}

// isFolderName reports whether name is an identity's folder (Open): 16
// lowercase hex digits.
func isFolderName(name string) bool {
	if len(name) != 16 {
		return false
	}
	for _, r := range name {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}
