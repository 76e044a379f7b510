package main

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// machine opens a persistent mock machine in a new state directory, as a
// plugin does before mocknvml acts on it.
func machine(t *testing.T) (nvdev.Interface, string) {
	t.Helper()
	dir := t.TempDir()
	lib, err := nvdev.Open(nvdev.Options{Backend: nvmock.Prefix + "dgxh100", MockSeed: "node-a", MockStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	return lib, dir
}

func device(t *testing.T, lib nvdev.Interface, uuid string) nvml.Device {
	t.Helper()
	d, err := lib.DeviceByUUID(uuid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustRun(t *testing.T, args ...string) {
	t.Helper()
	if err := run(args); err != nil {
		t.Fatalf("mocknvml %s: %v", strings.Join(args, " "), err)
	}
}

func TestUseSetsAGPUsUse(t *testing.T) {
	lib, dir := machine(t)
	mustRun(t, "use", "--state-dir", dir, "--gpu", "2", "--sm", "70", "--mem", "30", "--mem-used", "1Gi")
	dev := device(t, lib, lib.GPUs()[2].UUID)
	if u, ret := dev.GetUtilizationRates(); ret != nvml.SUCCESS || u != (nvml.Utilization{Gpu: 70, Memory: 30}) {
		t.Errorf("utilization %+v, %v; want 70%%, 30%%", u, ret)
	}
	if m, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS || m.Used != 1<<30 {
		t.Errorf("memory %+v, %v; want 1Gi used", m, ret)
	}
}

func TestUseSetsAMIGDevicesUse(t *testing.T) {
	lib, dir := machine(t)
	mustRun(t, "mig-layout", "--state-dir", dir, "--gpu", "1", "--profiles", "1g.10gb")
	migs := migUUIDs(t, device(t, lib, lib.GPUs()[1].UUID))
	mustRun(t, "use", "--state-dir", dir, "--mig", migs[0], "--sm", "40", "--mem-used", "512Mi")
	if m, ret := device(t, lib, migs[0]).GetMemoryInfo(); ret != nvml.SUCCESS || m.Used != 512<<20 {
		t.Errorf("MIG device memory %+v, %v; want 512Mi used", m, ret)
	}
	if err := run([]string{"use", "--state-dir", dir, "--mig", migs[0], "--mem", "10"}); err == nil {
		t.Error("use --mig took a memory utilization")
	}
}

func migUUIDs(t *testing.T, parent nvml.Device) []string {
	t.Helper()
	m, ret := parent.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("MIG device 0: %v", ret)
	}
	uuid, ret := m.GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return []string{uuid}
}

func TestProcRunsAndEndsAProcess(t *testing.T) {
	lib, dir := machine(t)
	mustRun(t, "proc", "--state-dir", dir, "--gpu", "0", "--pid", "1234", "--name", "python", "--sm", "70", "--mem-used", "512Mi")
	dev := device(t, lib, lib.GPUs()[0].UUID)
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS || len(procs) != 1 || procs[0].Pid != 1234 || procs[0].UsedGpuMemory != 512<<20 {
		t.Errorf("processes %+v, %v; want pid 1234 with 512Mi", procs, ret)
	}
	if s, ret := dev.GetProcessUtilization(0); ret != nvml.SUCCESS || len(s) != 1 || s[0].SmUtil != 70 {
		t.Errorf("process samples %+v, %v; want pid 1234 at 70%%", s, ret)
	}
	mustRun(t, "proc", "--state-dir", dir, "--pid", "1234", "--end")
	if procs, _ := dev.GetComputeRunningProcesses(); len(procs) != 0 {
		t.Errorf("after --end: %+v", procs)
	}
	if err := run([]string{"proc", "--state-dir", dir, "--pid", "1234", "--end"}); err == nil {
		t.Error("ending a process that runs nowhere did not fail")
	}
}

func TestUseUnsupported(t *testing.T) {
	lib, dir := machine(t)
	dev := device(t, lib, lib.GPUs()[3].UUID)
	mustRun(t, "use-unsupported", "--state-dir", dir, "--gpu", "3")
	if _, ret := dev.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization with the use calls off: %v, want NOT_SUPPORTED", ret)
	}
	mustRun(t, "use-unsupported", "--state-dir", dir, "--gpu", "3", "--off")
	if _, ret := dev.GetUtilizationRates(); ret != nvml.SUCCESS {
		t.Errorf("utilization with the use calls on again: %v", ret)
	}
}

func TestUseRefusesBadArguments(t *testing.T) {
	_, dir := machine(t)
	for _, args := range [][]string{
		{"use", "--state-dir", dir},
		{"use", "--state-dir", dir, "--gpu", "0", "--mig", "MIG-x"},
		{"use", "--state-dir", dir, "--gpu", "0", "--sm", "101"},
		{"use", "--state-dir", dir, "--gpu", "0", "--mem-used", "lots"},
		{"use", "--state-dir", dir, "--gpu", "0", "--mem-used", "-1Gi"},
		{"use", "--state-dir", dir, "--mig", "MIG-none"},
		{"proc", "--state-dir", dir, "--gpu", "0"},
		{"proc", "--state-dir", dir, "--pid", "7"},
	} {
		if err := run(args); err == nil {
			t.Errorf("mocknvml %s: no error", strings.Join(args, " "))
		}
	}
}
