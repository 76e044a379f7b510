package nvdev_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
)

func TestDeviceByUUIDCachesHandles(t *testing.T) {
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxa100", MockSeed: "x"})
	if err != nil {
		t.Fatal(err)
	}
	g := lib.GPUs()[3]
	d, err := lib.DeviceByUUID(g.UUID)
	if err != nil {
		t.Fatal(err)
	}
	idx, ret := d.GetIndex()
	if ret != nvml.SUCCESS || idx != 3 {
		t.Errorf("handle index = %d, %v", idx, ret)
	}
	if _, err := lib.DeviceByUUID("GPU-missing"); err == nil {
		t.Error("DeviceByUUID of an unknown UUID succeeded")
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := nvdev.Open(nvdev.Options{Backend: "mock:dgx9000"}); err == nil || !strings.Contains(err.Error(), "dgxh100") {
		t.Errorf("unknown machine: err = %v, want the list of machines", err)
	}
	if _, err := nvdev.Open(nvdev.Options{Backend: "fake"}); err == nil || !strings.Contains(err.Error(), `unknown NVML backend "fake"`) {
		t.Errorf("unknown backend: err = %v", err)
	}
	// No driver on this machine: the real backend must fail with one clear
	// error, not panic.
	_, err := nvdev.Open(nvdev.Options{Backend: nvdev.BackendReal, DriverRoot: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "NVML library not found") {
		t.Errorf("real backend without a driver: err = %v", err)
	}
}
