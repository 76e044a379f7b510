package plugin

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
)

// memoryLimitNode: GPU 0 whole, GPU 1 four replicas, GPU 2 shared, GPU 3
// shared through MPS.
func memoryLimitNode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{Strategy: configapi.MPSStrategy}}},
	}}
}

// memoryLimitHandler is the CDI handler of a node on driver r615 with
// NVIDIA's hooks, whose cgroups are v2 as cgroupV2 says, and the node's
// inventory.
func memoryLimitHandler(t *testing.T, cgroupV2 bool) (*cdi.Handler, inventory.Inventory) {
	t.Helper()
	root := cditest.NewDriverRoot(t, "615.20.03")
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: preparetest.Node, DriverRoot: root.Root})
	if err != nil {
		t.Fatal(err)
	}
	e := preparetest.NewEnv(t, "dgxh100", memoryLimitNode(), "")
	e.Lib, e.DriverRoot, e.CDIHook = lib, root.Root, cditest.DynamicHook(t)
	e.CgroupV2 = func() (bool, string) { return cgroupV2, "cgroup v1 in this test" }
	return e.NewCDIHandler(t), inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, memoryLimitNode())
}

// memoryLimitAttrs are the devices' memoryLimitEnforced attributes by
// name; nil for a device without one.
func memoryLimitAttrs(inv inventory.Inventory) map[string]*bool {
	out := map[string]*bool{}
	for _, d := range inv.Devices {
		out[d.Name()] = d.API.Attributes[device.AttrMemoryLimitEnforced].BoolValue
	}
	return out
}

// Replicas and shares say whether the driver holds their containers to
// their memory, as the node's CDI specs do; MPS shares say false (their
// daemon pins their memory), whole GPUs say nothing. Where the node does
// not enforce it, a Node event and the metric say why.
func TestPublishedDevicesSayWhetherMemoryIsEnforced(t *testing.T) {
	for _, enforced := range []bool{true, false} {
		handler, inv := memoryLimitHandler(t, enforced)
		log := &preparetest.EventLog{}
		_, ctx := ktesting.NewTestContext(t)
		metrics := telemetry.NewMetrics(prometheus.NewRegistry())
		got := memoryLimitAttrs(withMemoryLimits(ctx, inv, handler, telemetry.NewNodeEvents(ctx, log, nil, testNode), metrics))
		for name, want := range map[string]*bool{
			"gpu-0": nil, "gpu-1-ts-0": ptr.To(enforced), "gpu-1-ts-3": ptr.To(enforced),
			"gpu-2-shared": ptr.To(enforced), "gpu-3-shared": ptr.To(false),
		} {
			if (got[name] == nil) != (want == nil) || (want != nil && *got[name] != *want) {
				t.Errorf("enforced %v: %s %s = %v, want %v", enforced, name, device.AttrMemoryLimitEnforced, ptr.Deref(got[name], false), want)
			}
		}
		cause, value := "", 1.0
		if !enforced {
			cause, value = cdi.CauseCgroupV1, 0
		}
		if v := testutil.ToFloat64(metrics.MemoryLimits.WithLabelValues(cause)); v != value {
			t.Errorf("enforced %v: memory_limits_enforced{cause=%q} = %v, want %v", enforced, cause, v, value)
		}
		if warned := len(log.WithReason(ReasonMemoryLimitsNotEnforced)) > 0; warned == enforced {
			t.Errorf("enforced %v: %s event recorded: %v; events %v", enforced, ReasonMemoryLimitsNotEnforced, warned, log.Events)
		}
	}
}
