package session

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrDamaged marks a session file that cannot be used as it is.
var ErrDamaged = errors.New("session store damaged")

// damaged wraps err with the file's name and the way out.
func damaged(path string, err error) error {
	return fmt.Errorf("open session store %s: %w: %v; run `parley store check %s` for details, or `parley store repair %s` to move it aside and keep the sessions that can be read (or move it aside by hand to start empty)",
		path, ErrDamaged, err, path, path)
}

// ErrInUse marks a session file a running server holds: bbolt lets one
// process at a time open it, so it cannot be checked or repaired in place.
var ErrInUse = errors.New("session store in use")

// inUse is the error for a file whose lock another process holds, with the
// ways to check it anyway.
func inUse(path string) error {
	return fmt.Errorf("%s: %w: a running Parley holds it (one process at a time can open a bbolt file). "+
		"Its own check runs at every start, so a server that is up has a sound store; to check it now, stop the server "+
		"and run this again, or check a copy taken while the server is stopped", path, ErrInUse)
}

// safely runs f, turning a panic (bbolt asserts on some page corruptions
// instead of returning an error) into an error.
func safely(f func() error) (err error) {
	// A damaged page can point outside the mapped file: fault as a panic
	// here rather than kill the process.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bbolt: %v", r)
		}
	}()
	return f()
}

// openChecked opens a bbolt file and checks every page of it, turning
// errors and panics into one ErrDamaged error naming the file. The check
// reads the whole file: for a session store of tens of MB it takes well
// under a second. A lock timeout is returned as is.
func openChecked(path string, opts *bolt.Options) (*bolt.DB, error) {
	var db *bolt.DB
	// bbolt panics on some damaged pages after it has opened and locked the
	// file; the file it opened is kept here so that a failed open closes it
	// (and drops its lock) instead of leaking both.
	var file *os.File
	withFile := *opts
	withFile.OpenFile = func(name string, flag int, mode os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, mode)
		file = f
		return f, err
	}
	err := safely(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &withFile)
		return err
	})
	if err != nil && db == nil && file != nil {
		file.Close()
	}
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, err
	}
	if err != nil {
		return nil, damaged(path, err)
	}
	if err := checkDB(db); err != nil {
		db.Close()
		return nil, damaged(path, err)
	}
	return db, nil
}

// checkDB runs bbolt's consistency check and returns its first problems.
func checkDB(db *bolt.DB) error {
	return safely(func() error {
		return db.View(func(tx *bolt.Tx) error {
			var errs []error
			for err := range tx.Check() {
				if len(errs) < 5 {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		})
	})
}

// CheckBoltFile reports whether the session file at path is sound: nil, or
// an ErrDamaged error describing the damage. It opens the file read-only.
func CheckBoltFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		return damaged(path, errors.New("the file is empty (0 bytes)"))
	}
	db, err := openChecked(path, &bolt.Options{Timeout: openTimeout, ReadOnly: true})
	if errors.Is(err, berrors.ErrTimeout) {
		return inUse(path)
	}
	if err != nil {
		return err
	}
	err = safely(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if tx.Bucket(bucketSessions) == nil || tx.Bucket(bucketUpdated) == nil {
				return errors.New("not a Parley session store (its buckets are missing)")
			}
			return nil
		})
	})
	if err != nil {
		err = damaged(path, err)
	}
	return errors.Join(err, db.Close())
}

// RepairBoltFile moves the file at path aside (to path.damaged-TIME) and
// writes a fresh store at path holding every session that could be read
// from it. It returns where the old file went and how many sessions were
// kept. The server must not be running on the file.
func RepairBoltFile(path string) (movedTo string, kept int, err error) {
	movedTo = fmt.Sprintf("%s.damaged-%s", path, time.Now().UTC().Format("20060102T150405Z"))
	if err := os.Rename(path, movedTo); err != nil {
		return "", 0, fmt.Errorf("move %s aside: %w", path, err)
	}
	type rec struct {
		k, v  []byte
		owner string
	}
	var (
		recs  []rec
		idKey []byte // response ids' key, kept so that they still resolve
	)
	if st, err := os.Stat(movedTo); err == nil && st.Size() > 0 {
		// Salvage: read what can be read, stop at the first panic.
		_ = safely(func() error {
			old, err := bolt.Open(movedTo, 0o600, &bolt.Options{Timeout: openTimeout, ReadOnly: true})
			if err != nil {
				return err
			}
			defer old.Close()
			return old.View(func(tx *bolt.Tx) error {
				if m := tx.Bucket(bucketMeta); m != nil {
					if k := m.Get(keyIDKey); len(k) == idKeyBytes {
						idKey = bytes.Clone(k)
					}
				}
				b := tx.Bucket(bucketSessions)
				if b == nil {
					return nil
				}
				return b.ForEach(func(k, v []byte) error {
					if ValidID(string(k)) && len(v) > stampLen {
						if s, err := decodeRecord(v); err == nil {
							recs = append(recs, rec{bytes.Clone(k), bytes.Clone(v), s.Owner})
						}
					}
					return nil
				})
			})
		})
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: openTimeout})
	if err != nil {
		return movedTo, 0, fmt.Errorf("create %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		sessions, err := tx.CreateBucketIfNotExists(bucketSessions)
		if err != nil {
			return err
		}
		updated, err := tx.CreateBucketIfNotExists(bucketUpdated)
		if err != nil {
			return err
		}
		for _, name := range [][]byte{bucketOwners, bucketOwned} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if idKey != nil {
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			if err := meta.Put(keyIDKey, idKey); err != nil {
				return err
			}
		}
		for _, r := range recs {
			if err := addOwner(tx, r.owner, r.k, r.v[:stampLen]); err != nil {
				return err
			}
			if err := sessions.Put(r.k, r.v); err != nil {
				return err
			}
			if err := updated.Put(indexKey(r.v[:stampLen], r.k), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err = errors.Join(err, db.Close()); err != nil {
		return movedTo, 0, fmt.Errorf("write %s: %w", path, err)
	}
	return movedTo, len(recs), nil
}

// CheckNotInUse returns an ErrInUse error when another process (a running
// server) holds the lock of the bbolt file at path, without reading the
// file, so that a damaged file still reports its lock: `parley store repair`
// asks before it moves the file aside, which would lose what the server
// writes next. (Within one process a store that failed to open can leave
// its lock behind, so the question is for a separate process to ask.)
func CheckNotInUse(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	held, err := flockHeld(f)
	if err != nil {
		return err
	}
	if held {
		return inUse(path)
	}
	return nil
}
