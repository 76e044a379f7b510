package plugin

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestSocketName(t *testing.T) {
	const uid = types.UID("e1e169cd-d279-4cfc-b0e4-251d6d93b1ac")
	if got := SocketName("/var/lib/kubelet/plugins/gpu.gpuaas.io", ""); got != "dra.sock" {
		t.Errorf("without a pod UID: %s, want dra.sock", got)
	}
	if got := SocketName("/var/lib/kubelet/plugins/gpu.gpuaas.io", uid); got != "dra-"+string(uid)+".sock" {
		t.Errorf("rolling update: %s, want the UID in the name", got)
	}
	// MicroK8s' kubelet root: with the UID the path is 108 bytes, one too
	// many for bind(); the plugin failed to start there.
	long := "/var/snap/microk8s/common/var/lib/kubelet/plugins/gpu.gpuaas.io"
	name := SocketName(long, uid)
	if n := len(filepath.Join(long, name)); n > maxSocketPath {
		t.Fatalf("socket path %s is %d bytes, more than bind() takes", name, n)
	}
	if other := SocketName(long, "another-pod-uid-of-the-same-length-xx"); other == name {
		t.Errorf("two pods get the same socket %s", name)
	}
	if !strings.HasPrefix(name, "dra-") || !strings.HasSuffix(name, ".sock") {
		t.Errorf("socket name %s", name)
	}
}

// A socket under a long directory can really be bound.
func TestSocketNameBinds(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 60 {
		dir = filepath.Join(dir, "subdirectory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, SocketName(dir, "e1e169cd-d279-4cfc-b0e4-251d6d93b1ac")))
	if err != nil {
		t.Fatalf("binding the socket: %v", err)
	}
	_ = l.Close()
}
