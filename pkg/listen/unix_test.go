package listen

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// TestUnixSocketServesWhenItAppears dials the socket at the inotify event
// that shows its path, as the kubelet's plugin watcher does, over and over,
// and over a stale socket of a killed process: every dial must be taken.
func TestUnixSocketServesWhenItAppears(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gpu.gpuaas.io-reg.sock")
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		dialed := make(chan error, 1)
		go func() { dialed <- dialAtCreate(w, path) }()
		lis, err := UnixWhenServed(context.Background(), path)
		if err != nil {
			t.Fatalf("listen %d: %v", i, err)
		}
		if err := <-dialed; err != nil {
			t.Fatalf("dial %d at the socket's create event: %v", i, err)
		}
		if i%2 == 0 {
			// A killed process leaves its socket behind.
			_ = lis.(*renamedListener).Listener.Close()
			continue
		}
		if err := lis.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Fatalf("close %d left the socket behind: %v", i, err)
		}
	}
	assertNoHiddenSockets(t, dir)
}

// dialAtCreate waits for the event that creates path and dials it at once.
func dialAtCreate(w *fsnotify.Watcher, path string) error {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-w.Events:
			if ev.Name != path || !ev.Has(fsnotify.Create) {
				continue
			}
			conn, err := net.Dial("unix", path)
			if err != nil {
				return err
			}
			return conn.Close()
		case err := <-w.Errors:
			return err
		case <-timeout:
			return os.ErrDeadlineExceeded
		}
	}
}

// TestUnixSocketCloseKeepsTheSuccessorsSocket: a stopping plugin must not
// remove the socket a newer process already put at the same path.
func TestUnixSocketCloseKeepsTheSuccessorsSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpu.gpuaas.io-reg.sock")
	old, err := UnixWhenServed(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	successor, err := UnixWhenServed(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = successor.Close() }()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the old listener's Close removed its successor's socket: %v", err)
	}
	_ = conn.Close()
}

func TestUnixSocketRefusesADirectoryTooLongForBind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	_, err := UnixWhenServed(context.Background(), filepath.Join(dir, "x.sock"))
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("want an error naming the length, got %v", err)
	}
}

func assertNoHiddenSockets(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary socket %s left in %s", e.Name(), dir)
		}
	}
}
