package posture_test

import (
	"testing"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
	"k8s.io/klog/v2/ktesting"
)

// A GpuNode's status says, for each GPU offered as replicas or shares,
// whether the driver holds their containers to their memory, as the
// plugin's memoryLimitEnforced attribute says; whole and MIG GPUs say
// nothing, and neither does a node whose plugin publishes no attribute.
func TestSharedGPUsSayWhetherTheDriverEnforcesMemory(t *testing.T) {
	if posture.Attributes[len(posture.Attributes)-1] != device.AttrMemoryLimitEnforced {
		t.Fatalf("posture reads %q, the plugin publishes %q", posture.Attributes[len(posture.Attributes)-1], device.AttrMemoryLimitEnforced)
	}
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), openMachine(t), everyMode())
	for _, tc := range []struct {
		name string
		inv  inventory.Inventory
		want gpuaas.MemoryLimit
	}{
		{"enforced", inv.WithMemoryLimits(true), gpuaas.MemoryLimitDriverEnforced},
		{"not enforced", inv.WithMemoryLimits(false), gpuaas.MemoryLimitNotEnforced},
		{"no attribute", inv, ""},
	} {
		computed := posture.Compute(node, publishInventory(tc.inv), nil, nil)
		status := computed.Status()
		for _, g := range status.GPUs {
			want := gpuaas.MemoryLimit("")
			if g.Index == 1 || g.Index == 2 { // replicas, shared
				want = tc.want
			}
			if g.MemoryLimit != want {
				t.Errorf("%s: GPU %d (%s) memoryLimit %q, want %q", tc.name, g.Index, g.Mode, g.MemoryLimit, want)
			}
		}
	}
}
