package nvmock_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

func modes(t *testing.T, dev nvml.Device) (current, pending int) {
	t.Helper()
	current, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return current, pending
}

func minor(t *testing.T, dev nvml.Device) int {
	t.Helper()
	n, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return n
}

// Issue 25 item 2: the next K MIG mode changes of a GPU are refused with
// ERROR_IN_USE, whichever process makes them, and change nothing; then
// they work again.
func TestMockMigModeInUse(t *testing.T) {
	dir := t.TempDir()
	first := openOn(t, "dgxh100", dir)
	if err := nvmock.SetMigModeInUse(dir, "2", 2); err != nil {
		t.Fatal(err)
	}
	second := openOn(t, "dgxh100", dir)
	for _, lib := range []nvdev.Interface{first, second} {
		if _, ret := gpu(t, lib, 2).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.ERROR_IN_USE {
			t.Fatalf("SetMigMode with refusals left = %v, want ERROR_IN_USE", ret)
		}
		if cur, pend := modes(t, gpu(t, lib, 2)); cur != nvml.DEVICE_MIG_DISABLE || pend != cur {
			t.Fatalf("a refused change changed the mode: current %d pending %d", cur, pend)
		}
	}
	if _, ret := gpu(t, first, 3).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("another GPU refused: %v", ret)
	}
	if act, ret := gpu(t, first, 2).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
		t.Fatalf("after the refusals: %v, %v; want success", act, ret)
	}
	if cur, _ := modes(t, gpu(t, second, 2)); cur != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode %d after the change, want enabled", cur)
	}
}

// A process holding the GPU refuses every change while there, is listed
// by NVML with its name, and keeps a reset from running.
func TestMockMigModeHolder(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	holder := nvmock.Process{PID: 4242, Name: "dcgm-exporter"}
	if err := nvmock.SetHolder(dir, "1", holder, true); err != nil {
		t.Fatal(err)
	}
	dev := gpu(t, lib, 1)
	for range 3 {
		if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.ERROR_IN_USE {
			t.Fatalf("SetMigMode while held = %v, want ERROR_IN_USE", ret)
		}
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS || len(procs) != 1 || procs[0].Pid != holder.PID {
		t.Fatalf("processes on the GPU: %+v, %v; want pid %d", procs, ret, holder.PID)
	}
	if name, ret := lib.NVML().SystemGetProcessName(int(holder.PID)); ret != nvml.SUCCESS || name != holder.Name {
		t.Errorf("process name %q, %v; want %q", name, ret, holder.Name)
	}
	if procs, _ := gpu(t, lib, 0).GetComputeRunningProcesses(); len(procs) != 0 {
		t.Errorf("another GPU lists %+v", procs)
	}
	if err := nvmock.ResetGPU(dir, "1"); err == nil {
		t.Error("a GPU in use was reset")
	}
	if err := nvmock.SetHolder(dir, "1", holder, false); err != nil {
		t.Fatal(err)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode after the holder left = %v", ret)
	}
	if procs, _ := dev.GetComputeRunningProcesses(); len(procs) != 0 {
		t.Errorf("processes after the holder left: %+v", procs)
	}
}

// A change left pending is reported by GetMigMode in every process until a
// reset makes it current; setting the current mode cancels it.
func TestMockMigModePendingUntilReset(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	if err := nvmock.SetMigModePending(dir, "4", true); err != nil {
		t.Fatal(err)
	}
	dev := gpu(t, lib, 4)
	act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if ret != nvml.SUCCESS || act != nvml.ERROR_RESET_REQUIRED {
		t.Fatalf("SetMigMode = activation %v, %v; want RESET_REQUIRED, SUCCESS", act, ret)
	}
	next := openOn(t, "dgxh100", dir)
	if cur, pend := modes(t, gpu(t, next, 4)); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("after the change: current %d pending %d, want disabled, enabled pending", cur, pend)
	}
	if act, ret := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
		t.Fatalf("cancelling: %v, %v", act, ret)
	}
	if cur, pend := modes(t, dev); cur != nvml.DEVICE_MIG_DISABLE || pend != cur {
		t.Fatalf("after cancelling: current %d pending %d", cur, pend)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := nvmock.ResetGPU(dir, "4"); err != nil {
		t.Fatal(err)
	}
	if cur, pend := modes(t, dev); cur != nvml.DEVICE_MIG_ENABLE || pend != cur {
		t.Fatalf("after the reset: current %d pending %d, want enabled", cur, pend)
	}
}

// On Ampere a reboot applies the pending mode (kept across reboots).
func TestMockMigModePendingAppliedByReboot(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxa100", dir)
	if err := nvmock.SetMigModePending(dir, "0", true); err != nil {
		t.Fatal(err)
	}
	if _, ret := gpu(t, lib, 0).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, err := nvmock.Reboot(dir, ""); err != nil {
		t.Fatal(err)
	}
	after := openOn(t, "dgxa100", dir)
	if cur, pend := modes(t, gpu(t, after, 0)); cur != nvml.DEVICE_MIG_ENABLE || pend != cur {
		t.Fatalf("after the reboot: current %d pending %d, want enabled", cur, pend)
	}
}

// With rebind on, a mode change gives the GPU a minor number no other GPU
// has: handles from before are stale, a handle looked up again answers it,
// a process started later enumerates it, and a reboot gives the first
// minors back.
func TestMockRebindOnMigMode(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	if err := nvmock.SetRebindOnMigMode(dir, "3", true); err != nil {
		t.Fatal(err)
	}
	dev := gpu(t, lib, 3)
	if m := minor(t, dev); m != 3 {
		t.Fatalf("minor %d before, want 3", m)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.GetMinorNumber(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("the handle from before the re-bind answers %v, want GPU_IS_LOST", ret)
	}
	dev = lookUp(t, lib, 3)
	now := minor(t, dev)
	if now == 3 {
		t.Fatal("the minor did not change")
	}
	for i := range lib.GPUs() {
		if i != 3 && minor(t, gpu(t, lib, i)) == now {
			t.Fatalf("GPU %d has the new minor %d too", i, now)
		}
	}
	next := openOn(t, "dgxh100", dir)
	if g := next.GPUs()[3]; g.Minor != now {
		t.Errorf("a later process enumerates minor %d, want %d", g.Minor, now)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if m := minor(t, lookUp(t, lib, 3)); m == now {
		t.Errorf("minor %d unchanged by the second change", m)
	}
	if _, err := nvmock.Reboot(dir, ""); err != nil {
		t.Fatal(err)
	}
	if m := minor(t, gpu(t, openOn(t, "dgxh100", dir), 3)); m != 3 {
		t.Errorf("minor %d after the reboot, want 3", m)
	}
}

// lookUp asks NVML for a GPU's handle again, past nvdev's cache.
func lookUp(t *testing.T, lib nvdev.Interface, index int) nvml.Device {
	t.Helper()
	dev, ret := lib.NVML().DeviceGetHandleByUUID(lib.GPUs()[index].UUID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return dev
}

// A re-bind from outside (mocknvml rebind, as mig-manager re-binds a
// static-MIG GPU) gives the GPU a new minor number at once, without a mode
// change, and makes every process's handles of it stale until looked up
// again; the other GPUs' handles keep working.
func TestMockRebindFromOutside(t *testing.T) {
	dir := t.TempDir()
	first, second := openOn(t, "dgxh100", dir), openOn(t, "dgxh100", dir)
	before := []nvml.Device{gpu(t, first, 5), gpu(t, second, 5)}
	if err := nvmock.RebindGPU(dir, "5"); err != nil {
		t.Fatal(err)
	}
	for i, dev := range before {
		if _, ret := dev.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
			t.Errorf("process %d: the handle from before the re-bind answers %v, want GPU_IS_LOST", i, ret)
		}
		if cur, _, ret := dev.GetMigMode(); ret != nvml.ERROR_GPU_IS_LOST || cur != 0 {
			t.Errorf("process %d: GetMigMode on the stale handle = %d, %v; want 0, GPU_IS_LOST", i, cur, ret)
		}
	}
	now := minor(t, lookUp(t, first, 5))
	if now == 5 {
		t.Fatal("the minor did not change")
	}
	if m := minor(t, lookUp(t, second, 5)); m != now {
		t.Errorf("the other process reads minor %d, want %d", m, now)
	}
	if m := minor(t, gpu(t, first, 4)); m != 4 {
		t.Errorf("another GPU's handle answers minor %d, want 4", m)
	}
	if g := openOn(t, "dgxh100", dir).GPUs()[5]; g.Minor != now {
		t.Errorf("a later process enumerates minor %d, want %d", g.Minor, now)
	}
	if err := nvmock.RebindGPU(dir, "5"); err != nil {
		t.Fatal(err)
	}
	if m := minor(t, lookUp(t, first, 5)); m == now {
		t.Errorf("minor %d unchanged by the second re-bind", m)
	}
}

// An event registration made before a re-bind no longer delivers the
// GPU's events (those of the other GPUs still come); one made after it
// does.
func TestMockRebindSilencesEventRegistrations(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	old := eventSet(t, lib, xidTypes, 2, 3)
	if err := nvmock.RebindGPU(dir, "2"); err != nil {
		t.Fatal(err)
	}
	inject(t, dir, "2", nvml.EventTypeXidCriticalError, 48, whole, whole)
	inject(t, dir, "3", nvml.EventTypeXidCriticalError, 62, whole, whole)
	checkEvent(t, waitEvent(t, old), lib.GPUs()[3].UUID, nvml.EventTypeXidCriticalError, 62, whole, whole)
	waitNone(t, old)

	fresh, ret := lib.NVML().EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	t.Cleanup(func() { _ = fresh.Free() })
	if ret := gpu(t, lib, 2).RegisterEvents(xidTypes, fresh); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("registering with the stale handle = %v, want GPU_IS_LOST", ret)
	}
	if ret := lookUp(t, lib, 2).RegisterEvents(xidTypes, fresh); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	inject(t, dir, "2", nvml.EventTypeXidCriticalError, 79, whole, whole)
	checkEvent(t, waitEvent(t, fresh), lib.GPUs()[2].UUID, nvml.EventTypeXidCriticalError, 79, whole, whole)
	waitNone(t, old)
}
