package plugin

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
)

// everyMode: GPU 0 dynamic MIG, 1 time-sliced, 2 shared, the others whole.
func everyMode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}
}

// tainted returns the names of the devices carrying a taint of key.
func tainted(devices []device.AllocatableDevice, key string) map[string]bool {
	out := map[string]bool{}
	for _, d := range devices {
		for _, t := range d.API.Taints {
			if t.Key == key {
				out[d.Name()] = true
			}
		}
	}
	return out
}

func TestGPUFaultTaintsEveryDeviceOfItsGPU(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", everyMode())
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, everyMode())
	for index := range 4 {
		gpu := e.Lib.GPUs()[index]
		fault := health.Fault{Kind: health.KindXID, Value: "79", GPU: gpu.UUID, Effect: resourceapi.DeviceTaintEffectNoSchedule}
		got := tainted(inv.WithFaults([]health.Fault{fault}).Devices, "gpu.gpuaas.io/xid")
		want := 0
		for _, d := range inv.Devices {
			if d.GPU.UUID == gpu.UUID {
				want++
				if !got[d.Name()] {
					t.Errorf("GPU %d: device %s (%s) not tainted", index, d.Name(), d.Type())
				}
			}
		}
		if len(got) != want || want < 1 {
			t.Errorf("GPU %d: %d devices tainted, want the GPU's %d", index, len(got), want)
		}
	}
	if n := len(tainted(inv.Devices, "gpu.gpuaas.io/xid")); n != 0 {
		t.Fatalf("WithFaults changed the discovered inventory: %d devices tainted", n)
	}
}

func TestMIGFaultTaintsOnlyItsPartition(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", everyMode())
	var target device.AllocatableDevice
	for _, d := range e.Devices {
		if d.Partition() != nil && d.Partition().Profile.Name == "1g.10gb" {
			target = d
			break
		}
	}
	fault := health.Fault{Kind: health.KindXID, Value: "94", GPU: target.GPU.UUID, Effect: resourceapi.DeviceTaintEffectNoSchedule,
		MIG: &health.MIGScope{GIProfileID: target.Partition().Profile.GIProfileID, Placement: target.Partition().Placement}}
	inv := inventory.Inventory{Devices: e.Devices}
	got := tainted(inv.WithFaults([]health.Fault{fault}).Devices, "gpu.gpuaas.io/xid")
	if len(got) != 1 || !got[target.Name()] {
		t.Fatalf("tainted %v, want only %s", got, target.Name())
	}
}

func TestHealthReportNamesTheFault(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", everyMode())
	gpu := e.Lib.GPUs()[1] // four time-slice replicas
	faults := []health.Fault{
		{Kind: health.KindGPULost, Value: "not-answering", GPU: gpu.UUID, Effect: resourceapi.DeviceTaintEffectNoExecute},
		{Kind: health.KindUnmonitored, Value: "no-xid-events", GPU: e.Lib.GPUs()[5].UUID, Effect: resourceapi.DeviceTaintEffectNone},
	}
	report := healthReport(testNode, e.Devices, faults, time.Now())
	if len(report.Devices) != len(e.Devices) {
		t.Fatalf("report covers %d devices, want all %d", len(report.Devices), len(e.Devices))
	}
	unhealthy := 0
	for _, h := range report.Devices {
		if h.Health == kubeletplugin.HealthStatusUnhealthy {
			unhealthy++
			if !strings.Contains(h.Message, "gpu.gpuaas.io/gpu-lost=not-answering") || !strings.HasPrefix(h.DeviceName, "gpu-1") {
				t.Errorf("%s: message %q", h.DeviceName, h.Message)
			}
		}
		if h.PoolName != testNode || h.HealthCheckTimeout <= healthResendInterval {
			t.Errorf("%s: pool %q timeout %s", h.DeviceName, h.PoolName, h.HealthCheckTimeout)
		}
	}
	if unhealthy != 4 {
		t.Fatalf("%d unhealthy devices, want GPU 1's 4 replicas (an informational fault is healthy)", unhealthy)
	}
}
