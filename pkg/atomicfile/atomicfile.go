// Package atomicfile replaces files so that a reader, or a process that
// crashed and restarted, sees either the old content or the new, never a
// torn file. Write also makes the new content durable (it survives a power
// loss) at the cost of two fsyncs; Replace does not, for files whose loss
// in a power loss is harmless because everything they describe is lost
// with the kernel too.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
)

// syncs counts the fsyncs of this package, for benchmarks that report the
// durable writes an operation costs.
var syncs atomic.Int64

// Syncs returns how many fsyncs (of files and directories) this process
// has made through this package.
func Syncs() int64 { return syncs.Load() }

// Write replaces path with data durably: a temporary file in the same
// directory (named by tempPattern, as os.CreateTemp takes it, so that each
// caller's clean-up of leftovers recognises its own), written with mode,
// synced, renamed over path, and the directory synced so the rename
// survives too.
func Write(path string, data []byte, mode os.FileMode, tempPattern string) error {
	return replace(path, data, mode, tempPattern, true)
}

// Replace replaces path with data atomically but not durably: other
// processes, and this one after a crash, see the new content at once (it
// is in the page cache), but a power loss may leave the old content, or
// none where path is new.
func Replace(path string, data []byte, mode os.FileMode, tempPattern string) error {
	return replace(path, data, mode, tempPattern, false)
}

// Remove removes path durably: the directory is synced after it.
func Remove(path string) error {
	if err := os.Remove(path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

func replace(path string, data []byte, mode os.FileMode, tempPattern string, durable bool) (err error) {
	dir := filepath.Dir(path)
	tmp, err := createLocked(dir, tempPattern)
	if err != nil {
		return fmt.Errorf("creating temporary file for %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
		// Closing drops the lock: after the rename, or the removal.
		_ = tmp.Close()
	}()
	if _, err = tmp.Write(data); err != nil {
		return tempError("writing", path, tmp.Name(), err)
	}
	if err = tmp.Chmod(mode); err != nil {
		return tempError("setting the mode of", path, tmp.Name(), err)
	}
	if durable {
		syncs.Add(1)
		if err = tmp.Sync(); err != nil {
			return tempError("syncing", path, tmp.Name(), err)
		}
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	return SyncDir(dir)
}

// createLocked creates a temporary file and holds flock(2) on it until it
// is closed, so that another process's RemoveAbandoned (a plugin pod
// starting while the other pod of a rolling update writes) leaves it
// alone. One that RemoveAbandoned removed between its creation and the
// lock is made again.
func createLocked(dir, tempPattern string) (*os.File, error) {
	for {
		tmp, err := os.CreateTemp(dir, tempPattern)
		if err != nil {
			return nil, err
		}
		if err := flock(tmp, syscall.LOCK_EX); err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
			return nil, fmt.Errorf("locking %s: %w", tmp.Name(), err)
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(tmp.Fd()), &st); err != nil || st.Nlink > 0 {
			return tmp, nil
		}
		_ = tmp.Close() // removed before it was locked
	}
}

// RemoveAbandoned removes the temporary file at path unless a writer holds
// it (createLocked): a crashed writer's lock went with its process. It
// reports whether it removed the file.
func RemoveAbandoned(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }()
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // in flight
		}
		return false, fmt.Errorf("locking %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return false, err
	}
	return true, nil
}

func flock(f *os.File, how int) error {
	for {
		if err := syscall.Flock(int(f.Fd()), how); !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// SyncDir makes renames and removals in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory %s: %w", dir, err)
	}
	defer func() { _ = d.Close() }()
	syncs.Add(1)
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

// tempError describes a failed operation on the temporary file that will
// replace path. The os package's *PathError already names the temporary
// file, so the message names the replaced file and lets the cause name the
// temporary one, once.
func tempError(op, path, tmpName string, err error) error {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) && pathErr.Path == tmpName {
		return fmt.Errorf("%s %s: %w", op, path, err)
	}
	return fmt.Errorf("%s %s (temporary file %s): %w", op, path, tmpName, err)
}
