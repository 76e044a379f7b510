package plugin

import (
	"context"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// healthEnv is a driver on a persistent mock machine with a running health
// monitor, and the directory through which faults are injected as
// mocknvml does from outside the plugin.
type healthEnv struct {
	*testEnv
	driver  *Driver
	pub     *capturePublisher
	monitor *health.Monitor
	dir     string
}

func newHealthEnv(t *testing.T, cfg health.Config) *healthEnv {
	t.Helper()
	dir := t.TempDir()
	e := newTestEnvIn(t, "dgxh100", everyMode(), dir)
	if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ProbeInterval = 20 * time.Millisecond
	monitor := health.New(e.Lib, cfg, nil)
	e.faults = monitor
	e.state = e.newState(t)
	d, pub := testDriver(t, e, everyMode())
	watchWithMonitor(t, e, d, monitor)
	return &healthEnv{testEnv: e, driver: d, pub: pub, monitor: monitor, dir: dir}
}

// taintedDevices returns the published devices carrying a taint of key.
func (h *healthEnv) taintedDevices(t *testing.T, key string) map[string]bool {
	out := map[string]bool{}
	if h.pub.count() == 0 {
		return out
	}
	for _, s := range h.pub.last(t).Slices {
		for _, d := range s.Devices {
			for _, taint := range d.Taints {
				if taint.Key == key {
					out[d.Name] = true
				}
			}
		}
	}
	return out
}

func (h *healthEnv) waitTainted(t *testing.T, key string, what string, cond func(map[string]bool) bool) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := h.taintedDevices(t, key)
		if cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; %s on %v", what, key, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *healthEnv) devicesOfGPU(index int) map[string]bool {
	out := map[string]bool{}
	for _, d := range h.Devices {
		if d.GPU.Index == index {
			out[d.Name()] = true
		}
	}
	return out
}

func TestInjectedXIDTaintsTheGPUUntilQuiet(t *testing.T) {
	h := newHealthEnv(t, health.Config{QuietPeriod: 500 * time.Millisecond})
	for _, index := range []int{1, 3} { // time-sliced (4 replicas), whole
		want := h.devicesOfGPU(index)
		if err := nvmock.InjectEvent(h.dir, h.Lib.GPUs()[index].UUID, nvml.EventTypeXidCriticalError, 62, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
			t.Fatal(err)
		}
		h.waitTainted(t, "gpu.gpuaas.io/xid", "every device of the GPU tainted", func(got map[string]bool) bool { return maps.Equal(got, want) })
		h.waitTainted(t, "gpu.gpuaas.io/xid", "the quiet period to clear the taint", func(got map[string]bool) bool { return len(got) == 0 })
	}
}

func TestLostGPUIsTaintedAndReportedUnhealthyUntilItAnswers(t *testing.T) {
	h := newHealthEnv(t, health.Config{})
	gpu := h.Lib.GPUs()[2] // shared
	if err := nvmock.SetGPULost(h.dir, gpu.UUID, true); err != nil {
		t.Fatal(err)
	}
	want := h.devicesOfGPU(2)
	h.waitTainted(t, "gpu.gpuaas.io/gpu-lost", "the lost GPU's devices tainted", func(got map[string]bool) bool { return maps.Equal(got, want) })
	h.waitTainted(t, "gpu.gpuaas.io/xid", "XID 79 with it", func(got map[string]bool) bool { return maps.Equal(got, want) })

	reports := make(chan kubeletplugin.DeviceHealthReport, 1)
	ctx, cancel := context.WithCancel(h.Ctx)
	defer cancel()
	go func() { _ = h.driver.WatchHealthStatus(ctx, reports) }()
	report := <-reports
	for _, dh := range report.Devices {
		if want[dh.DeviceName] != (dh.Health == kubeletplugin.HealthStatusUnhealthy) {
			t.Errorf("%s: health %s (%s)", dh.DeviceName, dh.Health, dh.Message)
		}
	}

	if err := nvmock.SetGPULost(h.dir, gpu.UUID, false); err != nil {
		t.Fatal(err)
	}
	h.waitTainted(t, "gpu.gpuaas.io/gpu-lost", "recovery to clear gpu-lost", func(got map[string]bool) bool { return len(got) == 0 })
	h.waitTainted(t, "gpu.gpuaas.io/xid", "recovery (a reset) to clear XID 79", func(got map[string]bool) bool { return len(got) == 0 })
	select {
	case report = <-reports: // a change is reported at once, not at the next resend
	case <-time.After(healthResendInterval / 2):
		t.Fatal("no health report after the GPU recovered")
	}
	for _, dh := range report.Devices {
		if dh.Health != kubeletplugin.HealthStatusHealthy {
			t.Errorf("%s still %s after recovery: %s", dh.DeviceName, dh.Health, dh.Message)
		}
	}
}

func TestMIGScopedXIDTaintsOnlyThatMIGDevice(t *testing.T) {
	h := newHealthEnv(t, health.Config{})
	name := h.Partition(t, 0, "1g.10gb")
	if _, err := h.state.Prepare(h.Ctx, preparetest.NewClaim("m").Device("mig", name).Build()); err != nil {
		t.Fatal(err)
	}
	inst := h.MIGDevices(t, 0)[0]
	if err := nvmock.InjectEvent(h.dir, h.Lib.GPUs()[0].UUID, nvml.EventTypeXidCriticalError, 94, uint32(inst.GIID), uint32(inst.CIID)); err != nil {
		t.Fatal(err)
	}
	h.waitTainted(t, "gpu.gpuaas.io/xid", "only the MIG device tainted", func(got map[string]bool) bool {
		return maps.Equal(got, map[string]bool{name: true})
	})
}

func TestFailedMIGDestroyTaintsThePlacementUntilARetrySucceeds(t *testing.T) {
	h := newHealthEnv(t, health.Config{})
	name := h.Partition(t, 0, "2g.20gb")
	if _, err := h.state.Prepare(h.Ctx, preparetest.NewClaim("m").Device("mig", name).Build()); err != nil {
		t.Fatal(err)
	}
	gpu := h.Lib.GPUs()[0].UUID
	if err := nvmock.SetMigDestroyFails(h.dir, gpu, true); err != nil {
		t.Fatal(err)
	}
	if err := h.state.Unprepare(h.Ctx, "m"); err == nil {
		t.Fatal("Unprepare succeeded although the MIG device cannot be destroyed")
	}
	h.waitTainted(t, "gpu.gpuaas.io/cleanup-blocked", "the placement tainted", func(got map[string]bool) bool {
		return maps.Equal(got, map[string]bool{name: true})
	})
	if err := h.state.Unprepare(h.Ctx, "m"); err == nil {
		t.Fatal("a retry succeeded while destroy still fails")
	}
	if got := h.taintedDevices(t, "gpu.gpuaas.io/cleanup-blocked"); !maps.Equal(got, map[string]bool{name: true}) {
		t.Fatalf("after a failed retry: tainted %v", got)
	}
	if err := nvmock.SetMigDestroyFails(h.dir, gpu, false); err != nil {
		t.Fatal(err)
	}
	if err := h.state.Unprepare(h.Ctx, "m"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	h.waitTainted(t, "gpu.gpuaas.io/cleanup-blocked", "the retry to clear it", func(got map[string]bool) bool { return len(got) == 0 })
	if left := h.MIGDevices(t, 0); len(left) != 0 {
		t.Fatalf("MIG devices left: %+v", left)
	}
}

func TestPendingRowRemapTaintsTheGPUUntilApplied(t *testing.T) {
	h := newHealthEnv(t, health.Config{})
	gpu := h.Lib.GPUs()[3]
	if err := nvmock.SetRowRemapPending(h.dir, gpu.UUID, true); err != nil {
		t.Fatal(err)
	}
	want := h.devicesOfGPU(3)
	h.waitTainted(t, "gpu.gpuaas.io/row-remap", "the GPU tainted while a remapping is pending", func(got map[string]bool) bool { return maps.Equal(got, want) })
	if err := nvmock.SetRowRemapPending(h.dir, gpu.UUID, false); err != nil { // a reset applied it
		t.Fatal(err)
	}
	h.waitTainted(t, "gpu.gpuaas.io/row-remap", "the applied remapping to clear the taint", func(got map[string]bool) bool { return len(got) == 0 })
}

// watchWithMonitor runs monitor until the test ends and subscribes the
// driver to it, as Start does; the context is the monitor's.
func watchWithMonitor(t *testing.T, e *testEnv, d *Driver, monitor *health.Monitor) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { monitor.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	d.health = monitor
	d.watchHealth(ctx)
	return ctx
}
