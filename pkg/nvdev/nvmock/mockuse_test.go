package nvmock_test

import (
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

func setGPUUse(t *testing.T, dir, gpu string, use nvmock.GPUUse) {
	t.Helper()
	if err := nvmock.SetGPUUse(dir, gpu, use); err != nil {
		t.Fatal(err)
	}
}

func setProcessUse(t *testing.T, dir, device string, p nvmock.ProcessUse) {
	t.Helper()
	if err := nvmock.SetProcessUse(dir, device, p); err != nil {
		t.Fatal(err)
	}
}

func utilization(t *testing.T, dev nvml.Device) nvml.Utilization {
	t.Helper()
	u, ret := dev.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetUtilizationRates: %v", ret)
	}
	return u
}

// checkMemory checks both memory calls: used as set, free the rest.
func checkMemory(t *testing.T, dev nvml.Device, used uint64) {
	t.Helper()
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMemoryInfo: %v", ret)
	}
	if mem.Used != used || mem.Free != mem.Total-used || mem.Total == 0 {
		t.Errorf("GetMemoryInfo = %+v, want %d used and the rest free", mem, used)
	}
	v2, ret := dev.GetMemoryInfo_v2()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMemoryInfo_v2: %v", ret)
	}
	if v2.Used != used || v2.Total != mem.Total || v2.Free != mem.Free || v2.Version == 0 {
		t.Errorf("GetMemoryInfo_v2 = %+v, want %+v with a version", v2, mem)
	}
}

func pids(t *testing.T, dev nvml.Device) []nvml.ProcessInfo {
	t.Helper()
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeRunningProcesses: %v", ret)
	}
	slices.SortFunc(procs, func(a, b nvml.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return procs
}

// A GPU's use set from outside is what its utilization and memory calls
// answer, in the process that was running and in one started after; the
// other GPUs stay idle.
func TestMockGPUUse(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	dev := gpu(t, lib, 2)
	if u := utilization(t, dev); u != (nvml.Utilization{}) {
		t.Errorf("an idle GPU's utilization: %+v", u)
	}
	checkMemory(t, dev, 0)

	setGPUUse(t, dir, "2", nvmock.GPUUse{SMUtil: 70, MemUtil: 30, MemoryUsed: gib})
	for name, l := range map[string]nvdev.Interface{"running": lib, "restarted": openOn(t, "dgxh100", dir)} {
		if u := utilization(t, gpu(t, l, 2)); u != (nvml.Utilization{Gpu: 70, Memory: 30}) {
			t.Errorf("%s process: utilization %+v, want 70%% SM, 30%% memory", name, u)
		}
		checkMemory(t, gpu(t, l, 2), gib)
		if u := utilization(t, gpu(t, l, 3)); u != (nvml.Utilization{}) {
			t.Errorf("%s process: GPU 3's utilization %+v, want idle", name, u)
		}
	}
	if err := nvmock.SetGPUUse(dir, "2", nvmock.GPUUse{SMUtil: 101}); err == nil {
		t.Error("a utilization of 101% was taken")
	}
}

// Processes are listed with their memory and sampled with their
// utilization (an idle one not, as NVML samples only processes with some);
// the GPU reports at least what they add up to. An ended process is gone.
func TestMockProcessUse(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	dev := gpu(t, lib, 1)
	if _, ret := dev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("process utilization of an idle GPU: %v, want ERROR_NOT_FOUND", ret)
	}
	setProcessUse(t, dir, "1", nvmock.ProcessUse{PID: 1234, Name: "python", SMUtil: 60, MemUtil: 20, MemoryUsed: 512 * mib})
	setProcessUse(t, dir, lib.GPUs()[1].UUID, nvmock.ProcessUse{PID: 1235, MemoryUsed: 256 * mib})

	want := []nvml.ProcessInfo{
		{Pid: 1234, UsedGpuMemory: 512 * mib, GpuInstanceId: nvmock.WholeGPU, ComputeInstanceId: nvmock.WholeGPU},
		{Pid: 1235, UsedGpuMemory: 256 * mib, GpuInstanceId: nvmock.WholeGPU, ComputeInstanceId: nvmock.WholeGPU},
	}
	if got := pids(t, dev); !slices.Equal(got, want) {
		t.Errorf("running processes %+v\nwant %+v", got, want)
	}
	samples, ret := dev.GetProcessUtilization(0)
	if ret != nvml.SUCCESS || len(samples) != 1 || samples[0].Pid != 1234 || samples[0].SmUtil != 60 || samples[0].MemUtil != 20 || samples[0].TimeStamp == 0 {
		t.Fatalf("process utilization = %+v, %v; want one sample of pid 1234 at 60%% SM, 20%% memory", samples, ret)
	}
	if s, ret := dev.GetProcessUtilization(samples[0].TimeStamp + 60e6); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("samples newer than a minute from now: %+v, %v; want ERROR_NOT_FOUND", s, ret)
	}
	if u := utilization(t, dev); u != (nvml.Utilization{Gpu: 60, Memory: 20}) {
		t.Errorf("the GPU's utilization %+v, want its processes' 60%%, 20%%", u)
	}
	checkMemory(t, dev, 768*mib)
	// Every process is in the compute list; the MPS list is not supported
	// (as on the simulated library, which exports none), not a panic.
	if mps, ret := dev.GetMPSComputeRunningProcesses(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("MPS running processes = %+v, %v; want ERROR_NOT_SUPPORTED", mps, ret)
	}
	if name, ret := lib.NVML().SystemGetProcessName(1234); ret != nvml.SUCCESS || name != "python" {
		t.Errorf("process name = %q, %v", name, ret)
	}

	if err := nvmock.EndProcess(dir, 1234); err != nil {
		t.Fatal(err)
	}
	if got := pids(t, gpu(t, openOn(t, "dgxh100", dir), 1)); !slices.Equal(got, want[1:]) {
		t.Errorf("after pid 1234 ended, a new process lists %+v, want %+v", got, want[1:])
	}
	if got := pids(t, dev); !slices.Equal(got, want[1:]) {
		t.Errorf("after pid 1234 ended, the running process lists %+v, want %+v", got, want[1:])
	}
	if s, ret := dev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("process utilization after the busy process ended: %+v, %v; want ERROR_NOT_FOUND", s, ret)
	}
	if err := nvmock.EndProcess(dir, 1234); err == nil {
		t.Error("ending a process that runs nowhere did not fail")
	}
}

// A MIG device answers its instance's memory and processes; its
// utilization rates are not supported (nor the parent's, in MIG mode), and
// GPM measures its SM activity between two samples, through the parent
// and the instance's ID or through the MIG device's own handle.
func TestMockMIGUse(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	parent := gpu(t, lib, 4)
	busy, idle := makeMIG(t, parent, "3g.40gb", 0), makeMIG(t, parent, "1g.10gb", 4)
	if err := nvmock.SetMIGUse(dir, busy.UUID, nvmock.MIGUse{SMActivity: 70, MemoryUsed: gib}); err != nil {
		t.Fatal(err)
	}
	setProcessUse(t, dir, busy.UUID, nvmock.ProcessUse{PID: 42, MemoryUsed: 100 * mib})

	migDev, err := openOn(t, "dgxh100", dir).DeviceByUUID(busy.UUID) // a process started after
	if err != nil {
		t.Fatal(err)
	}
	checkMemory(t, migDev, gib)
	if _, ret := migDev.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization rates of a MIG device: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if _, ret := parent.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization rates of a GPU in MIG mode: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if _, ret := migDev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("process utilization of a MIG device: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	inMIG := nvml.ProcessInfo{Pid: 42, UsedGpuMemory: 100 * mib, GpuInstanceId: uint32(busy.GIID), ComputeInstanceId: uint32(busy.CIID)}
	if got := pids(t, migDev); !slices.Equal(got, []nvml.ProcessInfo{inMIG}) {
		t.Errorf("the MIG device's processes %+v, want %+v", got, inMIG)
	}
	if got := pids(t, parent); !slices.Equal(got, []nvml.ProcessInfo{inMIG}) {
		t.Errorf("the parent's processes %+v, want all of its instances' %+v", got, inMIG)
	}
	idleDev, err := lib.DeviceByUUID(idle.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if got := pids(t, idleDev); len(got) != 0 {
		t.Errorf("the other MIG device lists %+v", got)
	}
	checkMemory(t, idleDev, 0)

	if support, ret := lib.NVML().GpmQueryDeviceSupport(parent); ret != nvml.SUCCESS || support.IsSupportedDevice != 1 {
		t.Fatalf("GPM support of an H100: %+v, %v", support, ret)
	}
	got := gpmBetween(t, lib.NVML(), func(s nvml.GpmSample) nvml.Return { return lib.NVML().GpmMigSampleGet(parent, busy.GIID, s) },
		nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_DRAM_BW_UTIL)
	if math.Abs(got[0].Value-70) > 1e-6 || got[0].NvmlReturn != uint32(nvml.SUCCESS) {
		t.Errorf("SM activity through the parent: %+v, want 70", got[0])
	}
	if got[1].NvmlReturn != uint32(nvml.ERROR_NOT_SUPPORTED) {
		t.Errorf("a metric the mock does not simulate: %+v, want NOT_SUPPORTED", got[1])
	}
	got = gpmBetween(t, lib.NVML(), func(s nvml.GpmSample) nvml.Return { return lib.NVML().GpmSampleGet(migDev, s) }, nvml.GPM_METRIC_SM_UTIL)
	if math.Abs(got[0].Value-70) > 1e-6 {
		t.Errorf("SM activity through the MIG device: %+v, want 70", got[0])
	}
	got = gpmBetween(t, lib.NVML(), func(s nvml.GpmSample) nvml.Return { return lib.NVML().GpmMigSampleGet(parent, idle.GIID, s) }, nvml.GPM_METRIC_SM_UTIL)
	if got[0].Value != 0 || got[0].NvmlReturn != uint32(nvml.SUCCESS) {
		t.Errorf("SM activity of the idle instance: %+v, want 0", got[0])
	}
}

// gpmBetween takes two GPM samples with take and returns the metrics
// between them.
func gpmBetween(t *testing.T, lib nvml.Interface, take func(nvml.GpmSample) nvml.Return, metrics ...nvml.GpmMetricId) []nvml.GpmMetric {
	t.Helper()
	return gpmAround(t, lib, take, func() {}, metrics...)
}

// gpmAround is gpmBetween with between done between the samples.
func gpmAround(t *testing.T, lib nvml.Interface, take func(nvml.GpmSample) nvml.Return, between func(), metrics ...nvml.GpmMetricId) []nvml.GpmMetric {
	t.Helper()
	var samples [2]nvml.GpmSample
	for i := range samples {
		s, ret := lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		t.Cleanup(func() { _ = lib.GpmSampleFree(s) })
		samples[i] = s
	}
	if ret := take(samples[0]); ret != nvml.SUCCESS {
		t.Fatalf("first GPM sample: %v", ret)
	}
	between()
	if ret := take(samples[1]); ret != nvml.SUCCESS {
		t.Fatalf("second GPM sample: %v", ret)
	}
	// No version: go-nvml's library sets it, and so does the mock.
	mg := nvml.GpmMetricsGetType{NumMetrics: uint32(len(metrics)), Sample1: samples[0], Sample2: samples[1]}
	for i, m := range metrics {
		mg.Metrics[i].MetricId = uint32(m)
	}
	if ret := lib.GpmMetricsGet(&mg); ret != nvml.SUCCESS {
		t.Fatalf("GpmMetricsGet: %v", ret)
	}
	return mg.Metrics[:len(metrics)]
}

// GPM measures the mean activity between two samples: a change between
// them gives a value between the activities before and after.
func TestMockGPMMeansBetweenSamples(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	dev := gpu(t, lib, 0)
	setGPUUse(t, dir, "0", nvmock.GPUUse{SMUtil: 80})
	got := gpmAround(t, lib.NVML(), func(s nvml.GpmSample) nvml.Return { return s.Get(dev) },
		func() { setGPUUse(t, dir, "0", nvmock.GPUUse{}) }, nvml.GPM_METRIC_SM_UTIL)
	if v := got[0].Value; v <= 0 || v >= 80 {
		t.Errorf("SM activity over a change from 80%% to 0: %v, want between", v)
	}
}

// An A100 has no GPM: it says so, and its samples are not supported.
func TestMockGPMNotOnAmpere(t *testing.T) {
	lib := openOn(t, "dgxa100", t.TempDir())
	dev := gpu(t, lib, 0)
	if support, ret := lib.NVML().GpmQueryDeviceSupport(dev); ret != nvml.SUCCESS || support.IsSupportedDevice != 0 {
		t.Errorf("GPM support of an A100: %+v, %v; want not supported", support, ret)
	}
	s, _ := lib.NVML().GpmSampleAlloc()
	if ret := lib.NVML().GpmSampleGet(dev, s); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a GPM sample of an A100: %v, want ERROR_NOT_SUPPORTED", ret)
	}
}

// A GPU whose use calls are switched off answers them NOT_SUPPORTED, its
// MIG devices too; the calls every driver has keep answering.
func TestMockUseUnsupported(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	dev := gpu(t, lib, 3)
	inst := makeMIG(t, gpu(t, lib, 6), "1g.10gb", 0)
	if err := nvmock.SetUseSupported(dir, "3", false); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetUseSupported(dir, "6", false); err != nil {
		t.Fatal(err)
	}
	migDev, err := lib.DeviceByUUID(inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	checkUseAnswers(t, lib.NVML(), dev, nvml.ERROR_NOT_SUPPORTED)
	checkUseAnswers(t, lib.NVML(), migDev, nvml.ERROR_NOT_SUPPORTED)
	if support, ret := lib.NVML().GpmQueryDeviceSupport(dev); ret != nvml.SUCCESS || support.IsSupportedDevice != 0 {
		t.Errorf("GPM support with the use calls off: %+v, %v; want not supported", support, ret)
	}
	if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("GetMemoryInfo with the use calls off: %v", ret)
	}
	if _, ret := dev.GetComputeRunningProcesses(); ret != nvml.SUCCESS {
		t.Errorf("GetComputeRunningProcesses with the use calls off: %v", ret)
	}
	if u := utilization(t, gpu(t, lib, 2)); u != (nvml.Utilization{}) {
		t.Errorf("another GPU: %+v", u)
	}

	if err := nvmock.SetUseSupported(dir, "3", true); err != nil {
		t.Fatal(err)
	}
	utilization(t, dev)
	if err := nvmock.ClearFaults(dir); err != nil {
		t.Fatal(err)
	}
	checkMemory(t, migDev, 0)
}

// checkUseAnswers checks what a GPU's or MIG device's use calls answer.
func checkUseAnswers(t *testing.T, lib nvml.Interface, dev nvml.Device, want nvml.Return) {
	t.Helper()
	if _, ret := dev.GetUtilizationRates(); ret != want {
		t.Errorf("GetUtilizationRates: %v, want %v", ret, want)
	}
	if _, ret := dev.GetMemoryInfo_v2(); ret != want {
		t.Errorf("GetMemoryInfo_v2: %v, want %v", ret, want)
	}
	if _, ret := dev.GetProcessUtilization(0); ret != want {
		t.Errorf("GetProcessUtilization: %v, want %v", ret, want)
	}
	s, _ := lib.GpmSampleAlloc()
	if ret := lib.GpmSampleGet(dev, s); ret != want {
		t.Errorf("GpmSampleGet: %v, want %v", ret, want)
	}
}

// A lost GPU answers every use call, its MIG devices' too, with
// GPU_IS_LOST, as its other calls.
func TestMockUseOfLostGPU(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	dev := gpu(t, lib, 5)
	inst := makeMIG(t, gpu(t, lib, 7), "1g.10gb", 0)
	migDev, err := lib.DeviceByUUID(inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"5", "7"} {
		if err := nvmock.SetGPULost(dir, g, true); err != nil {
			t.Fatal(err)
		}
	}
	for name, d := range map[string]nvml.Device{"GPU": dev, "MIG device": migDev} {
		checkUseAnswers(t, lib.NVML(), d, nvml.ERROR_GPU_IS_LOST)
		if _, ret := d.GetComputeRunningProcesses(); ret != nvml.ERROR_GPU_IS_LOST {
			t.Errorf("%s: GetComputeRunningProcesses: %v, want ERROR_GPU_IS_LOST", name, ret)
		}
		if _, ret := lib.NVML().GpmQueryDeviceSupport(d); ret != nvml.ERROR_GPU_IS_LOST {
			t.Errorf("%s: GpmQueryDeviceSupport: %v, want ERROR_GPU_IS_LOST", name, ret)
		}
	}
}

// A machine never given use writes its state file as before use was
// state (no use fields), so such files, old ones among them, load; a
// reboot ends the processes and clears the use, and a reset refuses while
// processes run.
func TestMockUseStateFile(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	makeMIG(t, gpu(t, lib, 1), "1g.10gb", 0)
	data, err := os.ReadFile(nvmock.StatePath(dir, "dgxh100"))
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"use"`, `"processes"`} {
		if strings.Contains(string(data), field) {
			t.Errorf("a machine without use writes %s:\n%s", field, data)
		}
	}
	var st struct{ Version int }
	if err := json.Unmarshal(data, &st); err != nil || st.Version != 1 {
		t.Errorf("state version %d (%v), want 1 still", st.Version, err)
	}

	setGPUUse(t, dir, "0", nvmock.GPUUse{SMUtil: 50, MemoryUsed: gib})
	setProcessUse(t, dir, "0", nvmock.ProcessUse{PID: 7, SMUtil: 50})
	if err := nvmock.ResetGPU(dir, "0"); err == nil || !strings.Contains(err.Error(), "pid 7") {
		t.Errorf("resetting a GPU with a process running: %v, want a refusal naming pid 7", err)
	}
	if _, err := nvmock.Reboot(dir, ""); err != nil {
		t.Fatal(err)
	}
	after := gpu(t, openOn(t, "dgxh100", dir), 0)
	if u := utilization(t, after); u != (nvml.Utilization{}) {
		t.Errorf("utilization after a reboot: %+v", u)
	}
	checkMemory(t, after, 0)
	if got := pids(t, after); len(got) != 0 {
		t.Errorf("processes after a reboot: %+v", got)
	}
}

// A machine kept in memory answers the use calls as idle.
func TestMockUseInMemory(t *testing.T) {
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	dev := gpu(t, lib, 0)
	if u := utilization(t, dev); u != (nvml.Utilization{}) {
		t.Errorf("utilization: %+v", u)
	}
	checkMemory(t, dev, 0)
	if _, ret := dev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("process utilization: %v, want ERROR_NOT_FOUND", ret)
	}
	got := gpmBetween(t, lib.NVML(), func(s nvml.GpmSample) nvml.Return { return s.Get(dev) }, nvml.GPM_METRIC_SM_UTIL)
	if got[0].Value != 0 || got[0].NvmlReturn != uint32(nvml.SUCCESS) {
		t.Errorf("GPM SM activity: %+v", got[0])
	}
}

// The use set from outside survives the changes a plugin makes to the
// machine (which write the state file from the plugin's memory), and a
// process on a MIG device ends with the device.
func TestMockUseSurvivesThePluginsChanges(t *testing.T) {
	dir := t.TempDir()
	plugin := openOn(t, "dgxh100", dir)
	inst := makeMIG(t, gpu(t, plugin, 2), "1g.10gb", 0)
	setGPUUse(t, dir, "1", nvmock.GPUUse{SMUtil: 40})
	setProcessUse(t, dir, "1", nvmock.ProcessUse{PID: 11, MemoryUsed: mib})
	setProcessUse(t, dir, inst.UUID, nvmock.ProcessUse{PID: 12, MemoryUsed: mib})
	if err := nvmock.SetMIGUse(dir, inst.UUID, nvmock.MIGUse{SMActivity: 30, MemoryUsed: 2 * mib}); err != nil {
		t.Fatal(err)
	}
	makeMIG(t, gpu(t, plugin, 3), "1g.10gb", 0) // the plugin writes the state

	later := openOn(t, "dgxh100", dir)
	if got := pids(t, gpu(t, later, 1)); len(got) != 1 || got[0].Pid != 11 {
		t.Errorf("GPU 1's processes after the plugin's change: %+v, want pid 11", got)
	}
	if u := utilization(t, gpu(t, later, 1)); u.Gpu != 40 {
		t.Errorf("GPU 1's utilization after the plugin's change: %+v, want 40%%", u)
	}
	if got := pids(t, gpu(t, later, 2)); len(got) != 1 || got[0].Pid != 12 {
		t.Errorf("GPU 2's processes after the plugin's change: %+v, want pid 12", got)
	}
	migDev, err := later.DeviceByUUID(inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	checkMemory(t, migDev, 2*mib) // the instance's own, more than its process's
	if err := mig.Destroy(gpu(t, plugin, 2), inst); err != nil {
		t.Fatal(err)
	}
	if got := pids(t, gpu(t, openOn(t, "dgxh100", dir), 2)); len(got) != 0 {
		t.Errorf("processes of a destroyed MIG device: %+v", got)
	}
}
