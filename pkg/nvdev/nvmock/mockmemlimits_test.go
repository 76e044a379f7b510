package nvmock_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// openWithDriver opens the machine kept in dir reporting driver version
// (a driver root of that version).
func openWithDriver(t *testing.T, dir, version string) nvdev.Interface {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-a", MockStateDir: dir,
		DriverRoot: cditest.NewDriverRoot(t, version).Root})
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// On r615 a GPU keeps each cgroup's limits as machine state: another
// process (NVIDIA's hook sets them, the test reads them) finds them, and
// they go when cleared. Bad limits, a cgroup the driver cannot open and a
// caller that is not root are refused as nvml.h says.
func TestMemoryLimitsAreMachineState(t *testing.T) {
	defer nvmock.SetRoot(true)()
	dir, cgroup := t.TempDir(), t.TempDir()
	setter := openWithDriver(t, dir, "615.20.03")
	if ret := gpu(t, setter, 3).SetMemoryLimits_v1(cgroup, 10*gib, 10*gib); ret != nvml.SUCCESS {
		t.Fatalf("SetMemoryLimits_v1 on r615: %v", ret)
	}
	reader := openWithDriver(t, dir, "615.20.03")
	got, ret := gpu(t, reader, 3).GetMemoryLimits_v1(cgroup)
	if ret != nvml.SUCCESS || got.SoftLimit != 10*gib || got.HardLimit != 10*gib || got.NameSpace != cgroup {
		t.Fatalf("another process's GetMemoryLimits_v1 = %+v, %v; want 10 GiB soft and hard for %s", got, ret, cgroup)
	}
	if _, ret := gpu(t, reader, 2).GetMemoryLimits_v1(cgroup); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("limits of another GPU: %v, want NOT_FOUND (limits are per GPU)", ret)
	}
	for _, tc := range []struct {
		name       string
		cgroup     string
		soft, hard uint64
		want       nvml.Return
	}{
		{"soft above hard", cgroup, 2 * gib, gib, nvml.ERROR_INVALID_ARGUMENT},
		{"above the GPU's memory", cgroup, gib, 1000 * gib, nvml.ERROR_INVALID_ARGUMENT},
		{"relative cgroup", "kubepods/pod1", gib, gib, nvml.ERROR_INVALID_ARGUMENT},
		{"missing cgroup", cgroup + "/gone", gib, gib, nvml.ERROR_OPERATING_SYSTEM},
	} {
		if ret := gpu(t, setter, 3).SetMemoryLimits_v1(tc.cgroup, tc.soft, tc.hard); ret != tc.want {
			t.Errorf("%s: SetMemoryLimits_v1 = %v, want %v", tc.name, ret, tc.want)
		}
	}
	restore := nvmock.SetRoot(false)
	if ret := gpu(t, setter, 3).SetMemoryLimits_v1(cgroup, gib, gib); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("SetMemoryLimits_v1 not as root = %v, want NO_PERMISSION", ret)
	}
	restore()
	if ret := gpu(t, setter, 3).SetMemoryLimits_v1(cgroup, 0, nvml.DEVICE_MEMORY_LIMIT_MAX); ret != nvml.SUCCESS {
		t.Fatalf("clearing the limits: %v", ret)
	}
	if _, ret := gpu(t, reader, 3).GetMemoryLimits_v1(cgroup); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("limits after clearing: %v, want NOT_FOUND", ret)
	}
}

// Before r615 the driver has no memory limits, in memory or persistent;
// MIG handles are refused on any driver.
func TestMemoryLimitsRefusedBeforeR615AndOnMIG(t *testing.T) {
	defer nvmock.SetRoot(true)()
	cgroup := t.TempDir()
	for name, lib := range map[string]nvdev.Interface{
		"in memory":  openWithDriver(t, "", "580.95.05"),
		"persistent": openWithDriver(t, t.TempDir(), "580.95.05"),
	} {
		if ret := gpu(t, lib, 0).SetMemoryLimits_v1(cgroup, gib, gib); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("%s, driver 580: SetMemoryLimits_v1 = %v, want NOT_SUPPORTED", name, ret)
		}
	}
	lib := openWithDriver(t, t.TempDir(), "615.20.03")
	inst := makeMIG(t, gpu(t, lib, 1), "1g.10gb", 0)
	migDev, ret := lib.NVML().DeviceGetHandleByUUID(inst.UUID)
	if ret != nvml.SUCCESS {
		t.Fatalf("MIG handle %s: %v", inst.UUID, ret)
	}
	if ret := migDev.SetMemoryLimits_v1(cgroup, gib, gib); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("SetMemoryLimits_v1 on a MIG handle = %v, want NOT_SUPPORTED", ret)
	}
	if ret := gpu(t, lib, 0).SetMemoryLimits_v1(cgroup, gib, gib); ret != nvml.SUCCESS {
		t.Errorf("SetMemoryLimits_v1 on a whole GPU of r615 = %v", ret)
	}
}
