package prepare

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
)

// Issue 35: Kubernetes 1.34 with DRAPartitionableDevices refused every
// slice of a dynamic-MIG node (counter sets in a slice of their own, 80
// counters in one slice). In its layout each counter set is in the slice
// of the devices that consume it, at most 32 counters to a slice, and no
// device is lost.
func TestCountersBesideTheirDevices(t *testing.T) {
	e, cfg := unitModes(t, nil)
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)
	beside := sliceprobe.Full
	beside.Counters = sliceprobe.CountersInDeviceSlice
	pool := inventory.Resources(testNode, inv.ForCluster(beside)).Pools[testNode]
	devices := 0
	for i, s := range pool.Slices {
		own := map[string]bool{}
		counters := 0
		for _, cs := range s.SharedCounters {
			own[cs.Name] = true
			counters += len(cs.Counters)
		}
		if counters > 32 {
			t.Errorf("slice %d: %d counters, 1.34 allows 32", i, counters)
		}
		for _, d := range s.Devices {
			devices++
			for _, c := range d.ConsumesCounters {
				if !own[c.CounterSet] {
					t.Errorf("slice %d: device %s consumes set %s, which its slice does not define", i, d.Name, c.CounterSet)
				}
			}
		}
	}
	if devices != len(inv.Devices) {
		t.Errorf("%d devices published, the inventory has %d", devices, len(inv.Devices))
	}
}

// Where counters and consumable capacity are dropped (1.34 and 1.35 with
// default gates), nothing that needs them is offered: no dynamic-MIG GPU
// (its whole GPU and MIG devices would go to different claims at once), no
// memory share (stored as an exclusive device no capacity request fits),
// no counter set.
func TestForTheLeastCluster(t *testing.T) {
	e, cfg := unitModes(t, nil)
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg).ForCluster(sliceprobe.Least)
	if len(inv.CounterSets) != 0 {
		t.Errorf("%d counter sets kept", len(inv.CounterSets))
	}
	kinds := map[device.DeviceType]int{}
	for _, d := range inv.Devices {
		if d.OnDynamicMIG() || d.MultiAllocatable() || len(d.API.ConsumesCounters) > 0 {
			t.Errorf("device %s offered (dynamic MIG %v, shared %v, counters %v)", d.Name(), d.OnDynamicMIG(), d.MultiAllocatable(), d.API.ConsumesCounters)
		}
		kinds[d.Type()]++
	}
	if kinds[device.TypeGPU] == 0 || kinds[device.TypeTimeSlice] == 0 || kinds[device.TypeMIG] == 0 {
		t.Errorf("whole GPUs, replicas and static MIG should stay: %v", kinds)
	}
}

// Taints as each cluster keeps them: all of them where it keeps all; on
// 1.34 no effect None and at most 4, those that keep work off first;
// without device taints, a device a fault keeps work off is not offered.
func TestTaintsForEachCluster(t *testing.T) {
	taint := func(key string, effect resourceapi.DeviceTaintEffect) resourceapi.DeviceTaint {
		return resourceapi.DeviceTaint{Key: "gpu.gpuaas.io/" + key, Effect: effect}
	}
	inv := inventory.Inventory{Devices: []device.AllocatableDevice{
		{API: resourceapi.Device{Name: "faulty", Taints: []resourceapi.DeviceTaint{
			taint("info", resourceapi.DeviceTaintEffectNone), taint("ecc", resourceapi.DeviceTaintEffectNoSchedule),
			taint("a", resourceapi.DeviceTaintEffectNoSchedule), taint("b", resourceapi.DeviceTaintEffectNoSchedule),
			taint("c", resourceapi.DeviceTaintEffectNoSchedule), taint("lost", resourceapi.DeviceTaintEffectNoExecute),
		}}},
		{API: resourceapi.Device{Name: "informed", Taints: []resourceapi.DeviceTaint{taint("info", resourceapi.DeviceTaintEffectNone)}}},
		{API: resourceapi.Device{Name: "clean"}},
	}}
	keys := func(inv inventory.Inventory) map[string][]string {
		out := map[string][]string{}
		for _, d := range inv.Devices {
			out[d.API.Name] = []string{}
			for _, t := range d.API.Taints {
				out[d.API.Name] = append(out[d.API.Name], t.Key[len("gpu.gpuaas.io/"):])
			}
		}
		return out
	}
	v134 := sliceprobe.Support{Counters: sliceprobe.CountersInDeviceSlice, Taints: true, MaxTaints: 4}
	for _, c := range []struct {
		name    string
		support sliceprobe.Support
		want    map[string][]string
	}{
		{"all kept", sliceprobe.Full, map[string][]string{"faulty": {"info", "ecc", "a", "b", "c", "lost"}, "informed": {"info"}, "clean": {}}},
		{"1.34", v134, map[string][]string{"faulty": {"lost", "ecc", "a", "b"}, "informed": {}, "clean": {}}},
		{"no taints", sliceprobe.Least, map[string][]string{"informed": {}, "clean": {}}},
	} {
		got := keys(inv.TaintsFor(c.support))
		if len(got) != len(c.want) {
			t.Errorf("%s: devices %v, want %v", c.name, got, c.want)
			continue
		}
		for name, want := range c.want {
			if !slices.Equal(got[name], want) {
				t.Errorf("%s: device %s has taints %v, want %v", c.name, name, got[name], want)
			}
		}
	}
	if len(inv.Devices[0].API.Taints) != 6 {
		t.Error("TaintsFor changed the inventory it was given")
	}
}
