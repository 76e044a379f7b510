package main

import (
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

func openMock(t *testing.T, dir string) nvdev.Interface {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-a", MockStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// The checks show, on a mock machine with issue 25's faults injected, what
// they would show on a real node: the GPU the plugin cannot read, a MIG
// mode left pending, a GPU re-bound with a new minor, a process holding a
// GPU, and the driver version NVML reports.
func TestChecksShowInjectedFaults(t *testing.T) {
	dir := t.TempDir()
	before := openMock(t, dir)
	if err := nvmock.SetMigModePending(dir, "2", true); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetRebindOnMigMode(dir, "3", true); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{2, 3} {
		dev, err := before.DeviceByUUID(before.GPUs()[i].UUID)
		if err != nil {
			t.Fatal(err)
		}
		if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	if err := nvmock.SetHolder(dir, "1", nvmock.Process{PID: 4242, Name: "dcgm-exporter"}, true); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetGPULost(dir, "5", true); err != nil {
		t.Fatal(err)
	}

	r := runChecks(openMock(t, dir), t.TempDir())
	if r.GPUCount != "8" || len(r.GPUs) != 8 {
		t.Fatalf("GPU count %s, %d GPUs checked; want 8", r.GPUCount, len(r.GPUs))
	}
	if len(r.GPUProblems) != 1 || !strings.Contains(r.GPUProblems[0], "GPU 5") || !strings.Contains(r.GPUs[5].PluginRead, "GPU_IS_LOST") {
		t.Errorf("problems %q, GPU 5 read %q: want GPU 5 reported lost", r.GPUProblems, r.GPUs[5].PluginRead)
	}
	if g := r.GPUs[0]; g.PluginRead != "ok" || g.MigModeCurrent != "disabled" || g.Minor != "0" || g.SwitchesWithoutReset != "true" || len(g.Processes) != 0 {
		t.Errorf("a healthy GPU: %+v", g)
	}
	if g := r.GPUs[1]; len(g.Processes) != 1 || g.Processes[0] != (processSeen{PID: 4242, Name: "dcgm-exporter"}) {
		t.Errorf("processes on the held GPU: %+v", g.Processes)
	}
	if g := r.GPUs[2]; g.MigModeCurrent != "disabled" || g.MigModePending != "enabled" {
		t.Errorf("GPU 2 MIG mode %s pending %s, want disabled pending enabled", g.MigModeCurrent, g.MigModePending)
	}
	if g := r.GPUs[3]; g.MigModeCurrent != "enabled" || g.Minor == "3" {
		t.Errorf("GPU 3 MIG mode %s minor %s, want enabled on a new minor", g.MigModeCurrent, g.Minor)
	}
	if d := r.Driver; d.NVMLDriverVersion != before.System().DriverVersion || d.Agree != "false" || !strings.HasPrefix(d.Library, "not found") {
		t.Errorf("driver: %+v", d)
	}
}

// The health report shows what the plugin's monitor would do on a real
// node: a GPU that stops answering after start-up is found by the probe
// (and, unable to register for XID events, is marked watched by the probe
// alone); every other GPU is watched and has no fault.
func TestHealthReportFindsALostGPU(t *testing.T) {
	dir := t.TempDir()
	lib := openMock(t, dir)
	if err := nvmock.SetGPULost(dir, "4", true); err != nil {
		t.Fatal(err)
	}
	r := runHealth(lib, 3*time.Second)
	if !r.Watching {
		t.Errorf("watching %v: want every GPU registered for events", r.Watching)
	}
	kinds := map[string]bool{}
	for _, f := range r.Faults {
		if f.GPU != lib.GPUs()[4].UUID {
			t.Errorf("fault %+v: want faults on GPU 4 only", f)
		}
		kinds[f.Kind] = true
	}
	if !kinds[health.KindGPULost] || !kinds[health.KindUnmonitored] || len(kinds) != 2 {
		t.Errorf("fault kinds %v: want GPU 4 lost and unmonitored", kinds)
	}
}
