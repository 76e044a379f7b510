package nvdev_test

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

func memoryInfo(dev nvml.Device) error {
	_, ret := dev.GetMemoryInfo()
	return nvdev.Returned(ret)
}

// After a re-bind the cached handle is stale (the mock answers
// GPU_IS_LOST, as a real one may): DeviceByUUID kept handing it out, so
// every call through it failed for good. ForgetHandle makes the next
// lookup ask NVML again, which answers; through the Releasable too.
func TestForgetHandleAfterARebind(t *testing.T) {
	dir := t.TempDir()
	session := openOn(t, "dgxh100", dir)
	lib := nvdev.NewReleasable(session, nvdev.Options{})
	defer func() { _ = lib.Shutdown() }()
	uuid := lib.GPUs()[2].UUID
	if err := nvmock.RebindGPU(dir, "2"); err != nil {
		t.Fatal(err)
	}
	dev, err := lib.DeviceByUUID(uuid)
	if err != nil {
		t.Fatal(err)
	}
	if err := memoryInfo(dev); !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("the cached handle answers %v after the re-bind, want GPU_IS_LOST", err)
	}
	lib.ForgetHandle(uuid)
	if dev, err = lib.DeviceByUUID(uuid); err != nil {
		t.Fatal(err)
	}
	if err := memoryInfo(dev); err != nil {
		t.Fatalf("the handle looked up again answers %v", err)
	}
	if minor, ret := dev.GetMinorNumber(); ret != nvml.SUCCESS || minor == 2 {
		t.Errorf("minor %d (%v) after the re-bind, want a new one", minor, ret)
	}
}

// WithHandle tries a call that failed as a stale handle may once more on
// a handle asked for again: a re-bound GPU answers (renewed), a GPU that
// fell off the bus is still lost, and other failures are not retried.
func TestWithHandle(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	defer func() { _ = lib.Shutdown() }()
	rebound, lost, healthy := lib.GPUs()[1].UUID, lib.GPUs()[3].UUID, lib.GPUs()[4].UUID
	for _, uuid := range []string{rebound, lost, healthy} {
		if _, err := lib.DeviceByUUID(uuid); err != nil { // cached before
			t.Fatal(err)
		}
	}
	if err := nvmock.RebindGPU(dir, "1"); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetGPULost(dir, "3", true); err != nil {
		t.Fatal(err)
	}

	if renewed, err := nvdev.WithHandle(lib, rebound, memoryInfo); err != nil || !renewed {
		t.Errorf("re-bound GPU: renewed %v, err %v; want renewed, no error", renewed, err)
	}
	if renewed, err := nvdev.WithHandle(lib, rebound, memoryInfo); err != nil || renewed {
		t.Errorf("re-bound GPU, handle renewed: renewed %v, err %v; want neither", renewed, err)
	}
	if renewed, err := nvdev.WithHandle(lib, lost, memoryInfo); !errors.Is(err, nvml.ERROR_GPU_IS_LOST) || renewed {
		t.Errorf("lost GPU: renewed %v, err %v; want GPU_IS_LOST", renewed, err)
	}
	calls := 0
	renewed, err := nvdev.WithHandle(lib, healthy, func(nvml.Device) error { calls++; return nvml.ERROR_NOT_SUPPORTED })
	if !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) || renewed || calls != 1 {
		t.Errorf("other failure: renewed %v, err %v, %d calls; want NOT_SUPPORTED from one call", renewed, err, calls)
	}
}
