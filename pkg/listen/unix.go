package listen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// maxUnixPath is the longest socket path bind(2) takes on Linux
// (sizeof(sun_path) less its terminating NUL).
const maxUnixPath = 107

// UnixWhenServed listens on a Unix socket at path so that the path appears
// only once the socket accepts connections. The kubelet's plugin watcher
// dials a registration socket at the inotify event of its creation; a
// socket listened on in place exists from bind(2) and refuses connections
// until listen(2), and a registration refused there is retried only after
// the kubelet's backoff and its next one-second reconcile pass. So the
// socket is bound under a hidden name in the same directory (the watcher
// ignores names starting with "."), listened on, and renamed into place: a
// rename is atomic, replaces a stale socket of a killed process without a
// moment in which the path is missing, and the watcher sees it as a create.
// Its signature is kubeletplugin.RegistrarListener's.
func UnixWhenServed(ctx context.Context, path string) (net.Listener, error) {
	tmp, err := hiddenSibling(path)
	if err != nil {
		return nil, err
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", tmp, err)
	}
	// The listener would unlink the hidden name, which is gone once
	// renamed; Close removes the real path instead (renamedListener).
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Rename(tmp, path); err != nil {
		return nil, errors.Join(fmt.Errorf("moving socket %s into place at %s: %w", tmp, path, err), lis.Close(), os.Remove(tmp))
	}
	info, err := os.Lstat(path)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("reading the socket %s just made: %w", path, err), lis.Close())
	}
	return &renamedListener{Listener: lis, path: path, file: info}, nil
}

// hiddenSibling is a new hidden name next to path, short enough for
// bind(2) wherever path is.
func hiddenSibling(path string) (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("naming a temporary socket: %w", err)
	}
	tmp := filepath.Join(filepath.Dir(path), ".sock-"+hex.EncodeToString(b[:]))
	if len(tmp) > maxUnixPath {
		return "", fmt.Errorf("directory of socket %s too long for a temporary socket beside it (%d bytes, bind takes %d)", path, len(tmp), maxUnixPath)
	}
	return tmp, nil
}

// renamedListener removes its socket file on Close, unless another process
// has put a socket of its own at the path since (a rolling update's or a
// restarted plugin's): the kubelet would then lose the registration of a
// plugin that is still running.
type renamedListener struct {
	net.Listener
	path string
	file os.FileInfo
}

func (l *renamedListener) Close() error {
	err := l.Listener.Close()
	if now, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(now, l.file) {
		if rmErr := os.Remove(l.path); rmErr != nil && !os.IsNotExist(rmErr) {
			err = errors.Join(err, fmt.Errorf("removing socket %s: %w", l.path, rmErr))
		}
	}
	return err
}
