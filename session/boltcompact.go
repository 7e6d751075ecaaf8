package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// bbolt never gives disk back: deleted and expired sessions leave free
// pages that later writes reuse, but the file keeps its largest size. So the
// store compacts its file when it opens, if enough of it is free: it copies
// the live data into a new file (bbolt's Compact), syncs it, and renames it
// over the old one, which is atomic, so a crash at any point leaves either
// the old file or the new one whole.
const (
	// compactMinBytes: smaller files are not worth a copy.
	compactMinBytes = 1 << 20
	// compactWaste: compact when more than this fraction of the file is not
	// live data.
	compactWaste = 0.5
	// compactTxBytes bounds what one transaction of the copy holds.
	compactTxBytes = 16 << 20
)

// CompactResult is what a compaction did (for logs and tests).
type CompactResult struct {
	Before, After int64 // file sizes in bytes
	Live          int64 // bytes of the pages in use before
}

// compactWasteful compacts the open db at path when it is mostly free pages
// and returns the database to use: a fresh handle on the compacted file, or
// db itself when there was nothing to do or the copy failed (a full disk,
// say: the server then runs on the old file, and says so in the log).
func compactWasteful(db *bolt.DB, path string, log *zap.Logger) (*bolt.DB, error) {
	res, closed, err := compact(db, path)
	if err != nil {
		log.Warn("compact session store: kept the file as it is", zap.String("path", path), zap.Error(err))
	} else if closed {
		log.Info("compacted session store", zap.String("path", path),
			zap.Int64("bytes_before", res.Before), zap.Int64("bytes_after", res.After))
	}
	if !closed {
		return db, nil
	}
	ndb, err := openChecked(path, &bolt.Options{Timeout: openTimeout})
	if err != nil {
		return nil, fmt.Errorf("reopen compacted session store: %w", err)
	}
	return ndb, nil
}

// compact copies db into path.compact and renames it over path when the
// file is wasteful. closed reports whether it closed db (the caller opens
// path again: the compacted file, or the old one if the swap failed).
func compact(db *bolt.DB, path string) (res CompactResult, closed bool, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return res, false, err
	}
	res.Before = st.Size()
	if res.Before < compactMinBytes {
		return res, false, nil
	}
	if res.Live, err = liveBytes(db); err != nil {
		return res, false, err
	}
	if float64(res.Before-res.Live) <= compactWaste*float64(res.Before) {
		return res, false, nil
	}
	tmp := path + ".compact"
	_ = os.Remove(tmp) // a copy left by a crash during an earlier compaction
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: openTimeout})
	if err != nil {
		return res, false, fmt.Errorf("create %s: %w", tmp, err)
	}
	err = safely(func() error { return bolt.Compact(dst, db, compactTxBytes) })
	err = errors.Join(err, dst.Sync(), dst.Close())
	if err != nil {
		os.Remove(tmp)
		return res, false, fmt.Errorf("copy to %s: %w", tmp, err)
	}
	if err := db.Close(); err != nil {
		os.Remove(tmp)
		return res, true, fmt.Errorf("close before the swap: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return res, true, fmt.Errorf("swap in the compacted file: %w", err)
	}
	syncDir(path)
	if st, err := os.Stat(path); err == nil {
		res.After = st.Size()
	}
	return res, true, nil
}

// liveBytes is the bytes of the pages the file's buckets use.
func liveBytes(db *bolt.DB) (int64, error) {
	var n int64
	err := safely(func() error {
		return db.View(func(tx *bolt.Tx) error {
			n = 4 * int64(db.Info().PageSize) // two meta pages, the freelist, the root
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
				s := b.Stats()
				n += int64(s.BranchAlloc + s.LeafAlloc)
				return nil
			})
		})
	})
	return n, err
}

// syncDir makes a rename in path's directory durable (best effort: some
// file systems cannot sync a directory).
func syncDir(path string) {
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
