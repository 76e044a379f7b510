package nvmock_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

func TestOpenMockMachines(t *testing.T) {
	tests := []struct {
		machine, product, arch, cc string
		memGiB                     uint64
		sms                        int
		driver, cuda               string
	}{
		{"dgxa100", "A100-SXM4-40GB", "Ampere", "8.0", 40, 108, "550.54.15", "12.4"},
		{"dgxh100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 80, 132, "550.54.15", "12.4"},
		{"dgxh200", "NVIDIA H200 141GB HBM3e", "Hopper", "9.0", 141, 132, "550.54.15", "12.4"},
		{"dgxb200", "NVIDIA B200 180GB HBM3e", "Blackwell", "10.0", 180, 148, "560.28.03", "12.6"},
	}
	for _, tc := range tests {
		t.Run(tc.machine, func(t *testing.T) {
			lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + tc.machine, MockSeed: "node-a"})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer func() { _ = lib.Shutdown() }()
			sys := lib.System()
			if sys.DriverVersion != tc.driver || sys.CUDADriverVersion != tc.cuda {
				t.Errorf("System() = %+v", sys)
			}
			gpus := lib.GPUs()
			if len(gpus) != 8 {
				t.Fatalf("got %d GPUs, want 8", len(gpus))
			}
			for i, g := range gpus {
				checkGPU(t, i, g, tc.product, tc.arch, tc.cc, tc.memGiB, tc.sms)
			}
		})
	}
}

func checkGPU(t *testing.T, i int, g nvdev.GPU, product, arch, cc string, memGiB uint64, sms int) {
	t.Helper()
	if g.Index != i || g.Minor != i {
		t.Errorf("GPU %d: index %d minor %d", i, g.Index, g.Minor)
	}
	if !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) != 40 {
		t.Errorf("GPU %d: UUID %q", i, g.UUID)
	}
	if !strings.Contains(g.ProductName, product) || g.Architecture != arch || g.CUDAComputeCapability != cc {
		t.Errorf("GPU %d: product %q arch %q cc %q", i, g.ProductName, g.Architecture, g.CUDAComputeCapability)
	}
	if g.Brand != "Nvidia" {
		t.Errorf("GPU %d: brand %q", i, g.Brand)
	}
	if g.MemoryBytes/(1<<30) != memGiB {
		t.Errorf("GPU %d: memory %d GiB, want %d", i, g.MemoryBytes>>30, memGiB)
	}
	if g.Multiprocessors != sms {
		t.Errorf("GPU %d: %d SMs, want %d", i, g.Multiprocessors, sms)
	}
	if len(g.PCIBusID) != len("0000:18:00.0") || !strings.HasPrefix(g.PCIBusID, "0000:") {
		t.Errorf("GPU %d: bus ID %q", i, g.PCIBusID)
	}
	if !strings.HasPrefix(g.PCIeRoot, "pci0000:") || g.NUMANode != i/4 {
		t.Errorf("GPU %d: root %q numa %d", i, g.PCIeRoot, g.NUMANode)
	}
	if !g.MigCapable || g.MigEnabled {
		t.Errorf("GPU %d: MIG capable %v enabled %v", i, g.MigCapable, g.MigEnabled)
	}
}

func TestMockUUIDsStablePerSeed(t *testing.T) {
	uuids := func(seed string) []string {
		lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: seed})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, g := range lib.GPUs() {
			out = append(out, g.UUID)
		}
		return out
	}
	a, b, c := uuids("n1"), uuids("n1"), uuids("n2")
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Errorf("same seed gave different UUIDs")
	}
	if a[0] == c[0] {
		t.Errorf("different seeds gave the same UUID %s", a[0])
	}
	seen := map[string]bool{}
	for _, u := range a {
		if seen[u] {
			t.Errorf("duplicate UUID %s", u)
		}
		seen[u] = true
	}
}

// A mock machine over a driver root holding NVIDIA's real userspace reports
// that driver's version, so nvcdi finds its libraries (it looks them up by
// the version NVML reports).
func TestMockReportsTheDriverRootsVersion(t *testing.T) {
	root := t.TempDir()
	libDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"libnvidia-ml.so.535.261.03", "libcuda.so.535.261.03"} {
		if err := os.WriteFile(filepath.Join(libDir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libnvidia-ml.so.535.261.03", filepath.Join(libDir, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ root, driver, cuda string }{
		{root, "535.261.03", "12.2"},
		{t.TempDir(), "550.54.15", "12.4"}, // no driver installed: the machine's own
	} {
		lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-a", DriverRoot: tc.root})
		if err != nil {
			t.Fatal(err)
		}
		sys := lib.System()
		_ = lib.Shutdown()
		if sys.DriverVersion != tc.driver || sys.CUDADriverVersion != tc.cuda {
			t.Errorf("driver root %s: System() = %+v, want driver %s CUDA %s", tc.root, sys, tc.driver, tc.cuda)
		}
	}
}

// TestMockPCIBusIDsInNVMLsFormat: NVML writes busId with an 8-digit domain
// and busIdLegacy with a 4-digit one ("%08X:%02X:%02X.0", "%04X:..."), and
// go-nvlib before v0.12 strips "0000" from busId unconditionally: NVIDIA's
// DRA plugin (go-nvlib v0.10) read ":18:00.0" from a 4-digit busId and
// refused to start on the simulated library.
func TestMockPCIBusIDsInNVMLsFormat(t *testing.T) {
	s, err := nvmock.New("dgxh100", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"00000000:18:00.0", "00000000:38:00.0", "00000000:B8:00.0"} {
		index := []int{0, 1, 5}[i]
		d, ret := s.DeviceGetHandleByIndex(index)
		if ret != nvml.SUCCESS {
			t.Fatalf("GPU %d: %v", index, ret)
		}
		info, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			t.Fatalf("GPU %d: GetPciInfo: %v", index, ret)
		}
		if got := cString(info.BusId[:]); got != want {
			t.Errorf("GPU %d: busId %q, want %q", index, got, want)
		}
		if got, legacy := cString(info.BusIdLegacy[:]), want[4:]; got != legacy {
			t.Errorf("GPU %d: busIdLegacy %q, want %q", index, got, legacy)
		}
	}
}

func cString(b []int8) string {
	var out []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
