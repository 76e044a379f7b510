package usage

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

const podUID = "0f7d3c2a-1b4e-4c5d-9e8f-a1b2c3d4e5f6"

func TestPodOfCgroup(t *testing.T) {
	under := "0f7d3c2a_1b4e_4c5d_9e8f_a1b2c3d4e5f6"
	cases := map[string]struct {
		content string
		want    types.UID
	}{
		"v2 systemd":                         {"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + under + ".slice/cri-containerd-abc.scope\n", podUID},
		"v2 systemd guaranteed":              {"0::/kubepods.slice/kubepods-pod" + under + ".slice/cri-containerd-abc.scope\n", podUID},
		"v2 cgroupfs":                        {"0::/kubepods/besteffort/pod" + podUID + "/abc\n", podUID},
		"v2 cgroupfs guaranteed":             {"0::/kubepods/pod" + podUID + "/abc\n", podUID},
		"v1 cgroupfs":                        {"12:pids:/kubepods/burstable/pod" + podUID + "/abc\n11:memory:/kubepods/burstable/pod" + podUID + "/abc\n", podUID},
		"v1 systemd":                         {"12:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + under + ".slice/docker-abc.scope\n", podUID},
		"nested (node in a container)":       {"0::/system.slice/docker-node.scope/kubepods/burstable/pod" + podUID + "/abc\n", podUID},
		"v1 with an unnamed hierarchy first": {"1:name=systemd:/user.slice\n2:memory:/kubepods/pod" + podUID + "/abc\n", podUID},
		"host process":                       {"0::/system.slice/containerd.service\n", ""},
		"not a pod UID":                      {"0::/kubepods/podnot-a-uid/abc\n", ""},
		"pod outside kubepods":               {"0::/machine.slice/pod" + podUID + "/abc\n", ""},
		"empty":                              {"", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := PodOfCgroup([]byte(tc.content))
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("PodOfCgroup = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// fakeProc writes <root>/<pid>/cgroup for each pid's pod (cgroup v2,
// systemd driver).
func fakeProc(t testing.TB, root string, pods map[uint32]types.UID) {
	t.Helper()
	for pid, uid := range pods {
		dir := filepath.Join(root, strconv.Itoa(int(pid)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		line := "0::/kubepods/burstable/pod" + string(uid) + "/ctr\n"
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestProcPodsForgetsExitedPIDs(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, map[uint32]types.UID{42: podUID})
	p := newProcPods(root)
	if got := p.pod(42); got != podUID {
		t.Fatalf("pod(42) = %q, want %q", got, podUID)
	}
	p.endPass()
	// The PID exits and is reused by a host process.
	if err := os.WriteFile(filepath.Join(root, "42", "cgroup"), []byte("0::/system.slice/x.service\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := p.pod(42); got != podUID {
		t.Fatalf("pod(42) while still seen = %q, want the cached %q", got, podUID)
	}
	p.endPass()
	p.endPass() // a pass without PID 42
	if got := p.pod(42); got != "" {
		t.Errorf("pod(42) after it left NVML's lists = %q, want none (read again)", got)
	}
}
