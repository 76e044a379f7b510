package prepare

import (
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// migProfilesOnly offers dynamic MIG of the given profiles on every GPU.
func migProfilesOnly(profiles ...string) *configapi.NodeConfig {
	return &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic, MigProfiles: profiles}}
}

// A node configuration's migProfiles publish only those profiles' devices
// (and the whole GPU), with the same counter set; a profile the GPU lacks
// leaves the GPU out of dynamic MIG with the reason logged, rather than
// publishing a layout the admin did not ask for.
func TestDiscoverOffersOnlyTheListedMIGProfiles(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	all := inventory.Discover(klog.Background(), e.Lib, preparetest.DynamicAll())
	some := inventory.Discover(klog.Background(), e.Lib, migProfilesOnly("1g.10gb", "7g.80gb"))
	profiles := map[string]int{}
	for _, d := range some.Devices {
		if d.Partition() != nil {
			profiles[d.Partition().Profile.Name]++
		}
	}
	// 8 GPUs: 7 placements of 1g.10gb and 1 of 7g.80gb each.
	if len(profiles) != 2 || profiles["1g.10gb"] != 56 || profiles["7g.80gb"] != 8 {
		t.Errorf("offered partitions by profile %v, want 56 1g.10gb and 8 7g.80gb", profiles)
	}
	if got, want := len(some.Devices), 8*(1+7+1); got != want {
		t.Errorf("%d devices, want %d (whole GPU + 8 partitions per GPU)", got, want)
	}
	if len(some.CounterSets) != len(all.CounterSets) || len(some.CounterSets[0].Counters) != len(all.CounterSets[0].Counters) {
		t.Errorf("counter sets differ from offering every profile: %d sets", len(some.CounterSets))
	}
	bad := inventory.Discover(klog.Background(), e.Lib, migProfilesOnly("1g.10gb", "9g.99gb"))
	for _, d := range bad.Devices {
		if d.Partition() != nil {
			t.Fatalf("a GPU without profile 9g.99gb offers MIG device %s", d.API.Name)
		}
	}
}
