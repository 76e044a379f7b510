package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/sets"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// charDevRoot is a dev root whose nodes are real character devices, so the
// CDI library can stat them as a container runtime does when it applies a
// spec. Making them needs CAP_MKNOD; without it the test is skipped.
func charDevRoot(t *testing.T, gpuMinors ...uint32) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]uint64{
		"nvidiactl":        unix.Mkdev(195, 255),
		"nvidia-uvm":       unix.Mkdev(509, 0),
		"nvidia-uvm-tools": unix.Mkdev(509, 1),
	}
	for _, m := range gpuMinors {
		nodes["nvidia"+strconv.FormatUint(uint64(m), 10)] = unix.Mkdev(195, m)
	}
	for name, dev := range nodes {
		err := unix.Mknod(filepath.Join(root, "dev", name), unix.S_IFCHR|0o666, int(dev))
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot make device nodes here: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// inject applies the devices to an empty OCI spec through the CDI library's
// cache, as containerd and CRI-O do for one container.
func inject(t *testing.T, cdiRoot string, ids ...string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiRoot), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "PATH=/bin"}}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("InjectDevices(%v): unresolved %v: %v", ids, unresolved, err)
	}
	return spec
}

// envUUIDs lists the GPU and MIG UUIDs the container's environment names:
// NVIDIA_VISIBLE_DEVICES (what a legacy nvidia-container-runtime would
// inject on top of CDI) and the per-device variables.
func envUUIDs(env []string) (visible, perDevice sets.Set[string]) {
	visible, perDevice = sets.New[string](), sets.New[string]()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == visibleDevicesEnv:
			for _, u := range strings.Split(v, ",") {
				if u != "" && u != "void" && u != "none" {
					visible.Insert(u)
				}
			}
		case strings.HasPrefix(k, deviceEnvPrefix):
			perDevice.Insert(v)
		}
	}
	return visible, perDevice
}

// gpuNodes lists the /dev/nvidiaN nodes of the container.
func gpuNodes(spec *oci.Spec) sets.Set[string] {
	out := sets.New[string]()
	for _, d := range spec.Linux.Devices {
		if rest, ok := strings.CutPrefix(d.Path, "/dev/nvidia"); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			out.Insert(d.Path)
		}
	}
	return out
}

// A container may use several claims, and only some requests of a claim
// (resources.claims[].request): the kubelet gives it the CDI IDs of exactly
// those devices. The runtime applies each spec's spec-level edits once, then
// each device's, and for one environment variable the last value wins. A
// claim-wide NVIDIA_VISIBLE_DEVICES therefore named the GPUs of the last
// claim only, including ones of that claim the container did not get.
func TestContainerSeesExactlyItsDevicesAcrossClaims(t *testing.T) {
	devRoot := charDevRoot(t, 3, 5, 6)
	h, cdiRoot := newHandler(t, "", func(o *Options) { o.DevRoot = devRoot })
	claimA, claimB := "claim-a", "claim-b"
	idsA := write(t, h, claimA, []Device{{Name: "gpu-3", UUID: "GPU-aaaa", Minor: 3}})
	idsB := write(t, h, claimB, []Device{{Name: "gpu-5", UUID: "GPU-bbbb", Minor: 5}, {Name: "gpu-6", UUID: "GPU-cccc", Minor: 6}})

	cases := map[string]struct {
		ids   []string
		uuids []string
		nodes []string
	}{
		"two claims, one request of the second": {
			ids: []string{idsA["gpu-3"], idsB["gpu-5"]}, uuids: []string{"GPU-aaaa", "GPU-bbbb"}, nodes: []string{"/dev/nvidia3", "/dev/nvidia5"},
		},
		"same, other order": {
			ids: []string{idsB["gpu-5"], idsA["gpu-3"]}, uuids: []string{"GPU-aaaa", "GPU-bbbb"}, nodes: []string{"/dev/nvidia3", "/dev/nvidia5"},
		},
		"all of both claims": {
			ids:   []string{idsA["gpu-3"], idsB["gpu-5"], idsB["gpu-6"]},
			uuids: []string{"GPU-aaaa", "GPU-bbbb", "GPU-cccc"}, nodes: []string{"/dev/nvidia3", "/dev/nvidia5", "/dev/nvidia6"},
		},
		"one request of one claim": {
			ids: []string{idsB["gpu-6"]}, uuids: []string{"GPU-cccc"}, nodes: []string{"/dev/nvidia6"},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			spec := inject(t, cdiRoot, c.ids...)
			want := sets.New(c.uuids...)
			visible, perDevice := envUUIDs(spec.Process.Env)
			if !perDevice.Equal(want) {
				t.Errorf("the container's environment names %v, want exactly its devices %v; env %v", sets.List(perDevice), c.uuids, spec.Process.Env)
			}
			if extra := visible.Difference(want); extra.Len() > 0 {
				t.Errorf("%s names %v, which the container does not hold (a legacy nvidia runtime would add them); env %v", visibleDevicesEnv, sets.List(extra), spec.Process.Env)
			}
			if got := gpuNodes(spec); !got.Equal(sets.New(c.nodes...)) {
				t.Errorf("GPU nodes %v, want %v", sets.List(got), c.nodes)
			}
			if n := countPrefix(spec.Process.Env, visibleDevicesEnv+"="); n != 1 {
				t.Errorf("%s set %d times: %v", visibleDevicesEnv, n, spec.Process.Env)
			}
		})
	}
}

func countPrefix(env []string, prefix string) int {
	return len(slices.DeleteFunc(slices.Clone(env), func(e string) bool { return !strings.HasPrefix(e, prefix) }))
}
