package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// ShmMounter provides a GPU's shared memory directory, which its daemon and
// every client see at /dev/shm.
type ShmMounter interface {
	Mount(dir string) error
	Unmount(dir string) error
}

// DefaultShmSize bounds a GPU's MPS shared memory (a tmpfs takes memory
// only as it is written).
const DefaultShmSize = 1 << 30

// Tmpfs mounts a tmpfs of Size bytes on the directory, as NVIDIA's device
// plugin does for its MPS daemons: the memory clients write there is
// charged to their own cgroups, not to the kubelet's disk, the size is
// bounded, and mode 1777 lets clients that run as any user write.
// The mount must reach the host (the chart mounts the plugin's directory
// with Bidirectional propagation), where the daemon pod and the clients'
// CDI mounts find it.
type Tmpfs struct{ Size int64 }

// Mount implements ShmMounter; a directory that is a mount point already
// (a daemon restarted by the plugin) is left alone.
func (t Tmpfs) Mount(dir string) error {
	if ok, err := mountPoint(dir); err != nil || ok {
		return err
	}
	opts := fmt.Sprintf("size=%d,mode=1777", max(t.Size, 1<<20))
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting the MPS shared memory (tmpfs %s) at %s: %w", opts, dir, err)
	}
	return nil
}

// Unmount implements ShmMounter; a directory that is no mount point, or
// gone, is fine.
func (Tmpfs) Unmount(dir string) error {
	err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("unmounting the MPS shared memory at %s: %w", dir, err)
}

// mountPoint reports whether dir is on another file system than its parent.
func mountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	return st.Dev != parent.Dev, nil
}
