package deviceplugins_test

import (
	"reflect"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/deviceplugins"
)

var twoGPUsAndAThird = []deviceplugins.GPU{{Index: 0, UUID: "GPU-0"}, {Index: 1, UUID: "GPU-1"}, {Index: 2, UUID: "GPU-2"}}

// TestOwnersOfNVIDIAsIDs maps each kind of ID NVIDIA's device plugin
// advertises to its GPU.
func TestOwnersOfNVIDIAsIDs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources []deviceplugins.Resource
		owned     map[string][]string
		unmatched []string
	}{
		{name: "uuid", resources: []deviceplugins.Resource{{Name: "nvidia.com/gpu", IDs: []string{"GPU-1"}}},
			owned: map[string][]string{"GPU-1": {"nvidia.com/gpu=GPU-1"}}},
		{name: "time-slicing replicas",
			resources: []deviceplugins.Resource{{Name: "nvidia.com/gpu", IDs: []string{"GPU-2::0", "GPU-2::1"}}},
			owned:     map[string][]string{"GPU-2": {"nvidia.com/gpu=GPU-2::0", "nvidia.com/gpu=GPU-2::1"}}},
		{name: "MIG devices (mixed strategy)",
			resources: []deviceplugins.Resource{{Name: "nvidia.com/mig-1g.10gb", IDs: []string{"MIG-a", "MIG-b::3"}}},
			owned:     map[string][]string{"GPU-0": {"nvidia.com/mig-1g.10gb=MIG-a"}, "GPU-2": {"nvidia.com/mig-1g.10gb=MIG-b::3"}}},
		{name: "index strategy", resources: []deviceplugins.Resource{
			{Name: "nvidia.com/gpu", IDs: []string{"1", "0::2"}}, {Name: "nvidia.com/mig-2g.20gb", IDs: []string{"2:0"}}},
			owned: map[string][]string{"GPU-0": {"nvidia.com/gpu=0::2"}, "GPU-1": {"nvidia.com/gpu=1"},
				"GPU-2": {"nvidia.com/mig-2g.20gb=2:0"}}},
		{name: "not this node's", resources: []deviceplugins.Resource{{Name: "nvidia.com/gpu", IDs: []string{"GPU-9", "7", "MIG-z", "weird"}}},
			owned: map[string][]string{}, unmatched: []string{"nvidia.com/gpu=7", "nvidia.com/gpu=GPU-9", "nvidia.com/gpu=MIG-z", "nvidia.com/gpu=weird"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := deviceplugins.Owners(tc.resources, twoGPUsAndAThird, func() map[string]string {
				return map[string]string{"MIG-a": "GPU-0", "MIG-b": "GPU-2"}
			})
			if !reflect.DeepEqual(got.ByGPU, tc.owned) || !reflect.DeepEqual(got.Unmatched, tc.unmatched) {
				t.Errorf("Owners = %v, unmatched %v; want %v, unmatched %v", got.ByGPU, got.Unmatched, tc.owned, tc.unmatched)
			}
		})
	}
}

// TestOwnersReadsMIGParentsOnlyForMIGIDs: finding MIG devices' parents
// costs NVML calls on every MIG GPU, done only when a MIG UUID is seen.
func TestOwnersReadsMIGParentsOnlyForMIGIDs(t *testing.T) {
	calls := 0
	parents := func() map[string]string { calls++; return map[string]string{"MIG-a": "GPU-0"} }
	deviceplugins.Owners([]deviceplugins.Resource{{Name: "nvidia.com/gpu", IDs: []string{"GPU-0", "1"}}}, twoGPUsAndAThird, parents)
	if calls != 0 {
		t.Errorf("MIG parents read %d times without a MIG ID", calls)
	}
	deviceplugins.Owners([]deviceplugins.Resource{{Name: "nvidia.com/gpu", IDs: []string{"MIG-a", "MIG-a::1", "MIG-c"}}}, twoGPUsAndAThird, parents)
	if calls != 1 {
		t.Errorf("MIG parents read %d times for three MIG IDs, want once", calls)
	}
}
