package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
)

// specNodePaths lists the container paths of every device node a claim's
// spec names, spec level and device level.
func specNodePaths(t *testing.T, cdiRoot, uid string) []string {
	t.Helper()
	spec := readBack(t, cdiRoot, uid)
	paths := nodePaths(spec.ContainerEdits.DeviceNodes)
	for _, d := range spec.Devices {
		paths = append(paths, nodePaths(d.ContainerEdits.DeviceNodes)...)
	}
	return paths
}

// A node named by path only is stat'ed by the container runtime on the
// host: one that does not exist there fails every container of the claim.
// /dev/nvidia-uvm-tools (profilers only) is absent on many hosts; it was
// added to every spec regardless.
func TestMissingOptionalNodeIsLeftOut(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	if err := os.Remove(root.HostPath("/dev/nvidia-uvm-tools")); err != nil {
		t.Fatal(err)
	}
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{Verbosity: 1})
	h, cdiRoot := newHandler(t, root.Root, func(o *Options) { o.Logger = log })
	write(t, h, claimUID, twoGPUs())

	paths := specNodePaths(t, cdiRoot, claimUID)
	if slices.Contains(paths, "/dev/nvidia-uvm-tools") {
		t.Errorf("spec names /dev/nvidia-uvm-tools, which the host does not have: %v", paths)
	}
	if n := countContaining(logged, "/dev/nvidia-uvm-tools"); n != 1 {
		t.Errorf("logged the missing node %d times for one claim, want once: %v", n, logged)
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidia5"} {
		if !slices.Contains(paths, want) {
			t.Errorf("spec lacks %s, which the host has: %v", want, paths)
		}
	}
}

// With the driver installed, a device node an allocated device needs and
// the host lacks is an error at prepare, naming the node, instead of a
// container that fails (or starts without its GPU) later.
func TestMissingRequiredNodeFailsTheWrite(t *testing.T) {
	for _, node := range []string{"/dev/nvidia5", "/dev/nvidiactl"} {
		t.Run(node, func(t *testing.T) {
			root := cditest.NewDriverRoot(t, mockDriverVersion)
			if err := os.Remove(root.HostPath(node)); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			h, cdiRoot := newHandler(t, root.Root)
			_, err := h.WriteClaimSpec(claimUID, twoGPUs())
			if err == nil || !strings.Contains(err.Error(), node) {
				t.Fatalf("WriteClaimSpec without %s: error %v, want one naming the node", node, err)
			}
			if entries := dirNames(t, cdiRoot); len(entries) > 0 {
				t.Errorf("CDI root holds %v after a failed write", entries)
			}
		})
	}
}

// The plugin sees the host's dev root at a path of its own (the chart
// mounts / at /host): a node's existence is checked there, and the spec
// names the host's path.
func TestNodesAreCheckedInThePluginsViewAndNamedForTheHost(t *testing.T) {
	inContainer := cditest.NewDriverRoot(t, mockDriverVersion)
	if err := os.Remove(inContainer.HostPath("/dev/nvidia-uvm-tools")); err != nil {
		t.Fatal(err)
	}
	// The host's root as the plugin's process sees it has every node; it
	// must not be where existence is checked.
	hostRoot := cditest.NewDriverRoot(t, mockDriverVersion).Root
	h, cdiRoot := newHandler(t, inContainer.Root, func(o *Options) { o.HostDriverRoot = hostRoot })
	write(t, h, claimUID, twoGPUs())

	spec := readBack(t, cdiRoot, claimUID)
	for _, n := range append(slices.Clone(spec.ContainerEdits.DeviceNodes), spec.Devices[0].ContainerEdits.DeviceNodes...) {
		if n.Path == "/dev/nvidia-uvm-tools" {
			t.Errorf("spec names %s, absent from the plugin's view of the dev root", n.Path)
		}
		if n.HostPath != filepath.Join(hostRoot, n.Path) {
			t.Errorf("node %s: host path %q, want %q", n.Path, n.HostPath, filepath.Join(hostRoot, n.Path))
		}
	}
}
