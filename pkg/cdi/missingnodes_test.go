package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// Without /dev/nvidia-uvm every CUDA program in the container fails at
// cuInit, with nothing in the container saying why; nvcdi only warns in
// the plugin's log. With the driver installed the write fails naming the
// node and how to create it, and writes nothing (issue 25 item 6). The
// kubelet retries prepare, so the claim succeeds once the node exists.
func TestMissingUVMNodeFailsTheWrite(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	if err := os.Remove(root.HostPath("/dev/nvidia-uvm")); err != nil {
		t.Fatal(err)
	}
	h, cdiRoot := newHandler(t, root.Root)
	_, err := h.WriteClaimSpec(claimUID, twoGPUs())
	if err == nil || !strings.Contains(err.Error(), "/dev/nvidia-uvm ") || !strings.Contains(err.Error(), "nvidia-modprobe -u") {
		t.Fatalf("WriteClaimSpec without /dev/nvidia-uvm: error %v, want one naming the node and how to create it", err)
	}
	if entries := dirNames(t, cdiRoot); len(entries) > 0 {
		t.Errorf("CDI root holds %v after a failed write", entries)
	}

	// The node appears (something loaded nvidia-uvm): the retry succeeds.
	if err := os.WriteFile(root.HostPath("/dev/nvidia-uvm"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	write(t, h, claimUID, twoGPUs())
	if paths := specNodePaths(t, cdiRoot, claimUID); !slices.Contains(paths, "/dev/nvidia-uvm") {
		t.Errorf("spec lacks /dev/nvidia-uvm once the host has it: %v", paths)
	}
}

// Without a driver under the driver root (simulated GPUs) a missing
// /dev/nvidia-uvm is left out, as before: nothing there runs CUDA.
func TestMissingUVMNodeWithoutDriverIsLeftOut(t *testing.T) {
	devRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(devRoot, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nvidiactl", "nvidia3", "nvidia5"} {
		if err := os.WriteFile(filepath.Join(devRoot, "dev", n), nil, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	h, cdiRoot := newHandler(t, devRoot)
	write(t, h, claimUID, twoGPUs())
	if paths := specNodePaths(t, cdiRoot, claimUID); slices.Contains(paths, "/dev/nvidia-uvm") {
		t.Errorf("spec names /dev/nvidia-uvm, which the host lacks: %v", paths)
	}
}

func migDevice() Device {
	return Device{Name: "gpu-3-mig-1g.10gb-0", UUID: "MIG-5e2b8c1a-0d4f-5b6e-9a7c-3f1e2d4c6b8a", Minor: 3}
}

// A MIG device reaches the CDI step without capability nodes when the
// driver's mig-minors file is missing; no process in the container can
// then open it. Where the kernel has the capability driver the file must
// exist, so the write fails saying so; where it has none (simulated
// GPUs) the device is written, and the log says what the container lacks.
func TestMIGDeviceWithoutCapNodes(t *testing.T) {
	procDevices := func(t *testing.T, content string) string {
		path := filepath.Join(t.TempDir(), "devices")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	t.Run("kernel has nvidia-caps", func(t *testing.T) {
		root := cditest.NewDriverRoot(t, mockDriverVersion)
		path := procDevices(t, "Character devices:\n195 nvidia\n237 nvidia-caps\n")
		h, cdiRoot := newHandler(t, root.Root, func(o *Options) { o.ProcDevicesPath = path })
		_, err := h.WriteClaimSpec(claimUID, []Device{migDevice()})
		if err == nil || !strings.Contains(err.Error(), mig.MigMinorsPath) || !strings.Contains(err.Error(), migDevice().UUID) {
			t.Fatalf("WriteClaimSpec of a MIG device without capability nodes: error %v, want one naming the device and %s", err, mig.MigMinorsPath)
		}
		if entries := dirNames(t, cdiRoot); len(entries) > 0 {
			t.Errorf("CDI root holds %v after a failed write", entries)
		}
		// With its nodes it is written.
		d := migDevice()
		d.ExtraNodes = []mig.CapNode{{Path: "/dev/nvidia-caps/nvidia-cap30", Minor: 30}, {Path: "/dev/nvidia-caps/nvidia-cap31", Minor: 31}}
		write(t, h, claimUID, []Device{d})
	})
	t.Run("no NVIDIA kernel module", func(t *testing.T) {
		root := cditest.NewDriverRoot(t, mockDriverVersion)
		path := procDevices(t, "Character devices:\n1 mem\n")
		var logged []string
		log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
		h, _ := newHandler(t, root.Root, func(o *Options) { o.ProcDevicesPath = path; o.Logger = log })
		write(t, h, claimUID, []Device{migDevice()})
		if countContaining(logged, "without capability nodes") != 1 {
			t.Errorf("a MIG device written without capability nodes was not logged once: %v", logged)
		}
	})
}
