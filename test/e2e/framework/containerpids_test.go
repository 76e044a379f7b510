package framework

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const trainerContainer = "3f1c0b9a7e5d4c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a190817263544536"

// procRoot writes a fake /proc: each PID's cgroup file, "" for a process
// that has none left (it exited).
func procRoot(t *testing.T, cgroups map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, cgroup := range cgroups {
		dir := filepath.Join(root, pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if cgroup == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestContainerHostPID(t *testing.T) {
	podCgroup := "/demo-node1/kubepods/besteffort/pod8b0c3a52-1111-2222-3333-444455556666/"
	root := procRoot(t, map[string]string{
		"1":    "0::/init.scope\n",
		"self": "0::/" + trainerContainer + "\n", // not a PID
		// The pause container of the same pod: another container's ID.
		"310": "12:memory:" + podCgroup + "0a0b0c\n",
		// The container's process and a child of it: the lowest PID is
		// the container's own.
		"4242": "12:memory:" + podCgroup + trainerContainer + "\n11:cpu:" + podCgroup + trainerContainer + "\n",
		"4250": "0::" + podCgroup + trainerContainer + "\n",
		"4300": "", // exited while the demo read /proc
	})
	pid, err := ContainerHostPID(root, trainerContainer)
	if err != nil || pid != 4242 {
		t.Errorf("containerHostPID = %d, %v; want 4242", pid, err)
	}
	if pid, err := ContainerHostPID(root, strings.Repeat("f", 64)); err == nil {
		t.Errorf("a container with no process: PID %d, want an error", pid)
	}
	if _, err := ContainerHostPID(root, ""); err == nil {
		t.Error("no container ID: want an error")
	}
}
