package prepare

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

func TestPublishedWholeGPUs(t *testing.T) {
	tests := []struct {
		machine, product, arch, cc string
		memory                     string
		sms                        int64
	}{
		{"dgxa100", "Mock NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40Gi", 108},
		{"dgxh100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi", 132},
	}
	for _, tc := range tests {
		t.Run(tc.machine, func(t *testing.T) {
			e := newTestEnv(t, tc.machine)
			res := inventory.Resources(testNode, inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, &configapi.NodeConfig{}))
			pool, ok := res.Pools[testNode]
			if !ok || len(res.Pools) != 1 {
				t.Fatalf("pools = %v, want one named %q", res.Pools, testNode)
			}
			checkPoolValid(t, pool)
			// The GPUs' unit-only counter sets, then the GPUs.
			if len(pool.Slices) != 2 || len(pool.Slices[0].SharedCounters) != 8 || len(pool.Slices[1].Devices) != 8 {
				t.Fatalf("want a slice of 8 counter sets and one of 8 devices, got %d slices", len(pool.Slices))
			}
			for i, d := range pool.Slices[1].Devices {
				gpu := e.Lib.GPUs()[i]
				checkWholeGPU(t, d, gpu, i, tc.product, tc.arch, tc.cc, tc.memory, tc.sms)
				if set, milli := milliunits(d); set != mig.CounterSetName(i) || milli != mig.GPUMilliunits {
					t.Errorf("%s takes %d milliunits of %q, want 1000 of %s", d.Name, milli, set, mig.CounterSetName(i))
				}
			}
		})
	}
}

func checkWholeGPU(t *testing.T, d resourceapi.Device, gpu nvdev.GPU, i int, product, arch, cc, memory string, sms int64) {
	t.Helper()
	if d.Name != fmt.Sprintf("gpu-%d", i) || len(validation.IsDNS1123Label(d.Name)) != 0 {
		t.Errorf("device %d name %q", i, d.Name)
	}
	str := func(n resourceapi.QualifiedName) string {
		if v := d.Attributes[n].StringValue; v != nil {
			return *v
		}
		return "<unset>"
	}
	ver := func(n resourceapi.QualifiedName) string {
		if v := d.Attributes[n].VersionValue; v != nil {
			return *v
		}
		return "<unset>"
	}
	wantStr := map[resourceapi.QualifiedName]string{
		"type": "gpu", "uuid": gpu.UUID, "productName": product, "brand": "Nvidia", "architecture": arch,
		"resource.kubernetes.io/pciBusID": gpu.PCIBusID, "resource.kubernetes.io/pcieRoot": gpu.PCIeRoot,
	}
	for n, want := range wantStr {
		if got := str(n); got != want {
			t.Errorf("%s: attribute %s = %q, want %q", d.Name, n, got, want)
		}
	}
	for n, want := range map[resourceapi.QualifiedName]string{
		"cudaComputeCapability": cc, "driverVersion": "550.54.15", "cudaDriverVersion": "12.4.0",
	} {
		if got := ver(n); got != want {
			t.Errorf("%s: version %s = %q, want %q", d.Name, n, got, want)
		}
	}
	if v := d.Attributes["index"].IntValue; v == nil || *v != int64(i) {
		t.Errorf("%s: index %v", d.Name, v)
	}
	if v := d.Attributes["resource.kubernetes.io/numaNode"].IntValue; v == nil || *v != int64(i/4) {
		t.Errorf("%s: numaNode %v", d.Name, v)
	}
	if v := d.Attributes["migCapable"].BoolValue; v == nil || !*v {
		t.Errorf("%s: migCapable %v", d.Name, v)
	}
	if got := d.Capacity["memory"].Value; got.Cmp(resource.MustParse(memory)) != 0 {
		t.Errorf("%s: memory %s, want %s", d.Name, got.String(), memory)
	}
	if got := d.Capacity["multiprocessors"].Value; got.Value() != sms {
		t.Errorf("%s: multiprocessors %s, want %d", d.Name, got.String(), sms)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%s: %d attributes and capacities, over the API limit", d.Name, n)
	}
}

func TestSlicesHoldAtMost64Devices(t *testing.T) {
	var devices []device.AllocatableDevice
	for i := range 130 {
		devices = append(devices, device.AllocatableDevice{API: resourceapi.Device{Name: fmt.Sprintf("d-%d", i)}})
	}
	pool := inventory.Resources("n", inventory.Inventory{Devices: devices}).Pools["n"]
	sizes := []int{}
	for _, s := range pool.Slices {
		sizes = append(sizes, len(s.Devices))
	}
	if fmt.Sprint(sizes) != "[64 64 2]" {
		t.Errorf("slice sizes = %v, want [64 64 2]", sizes)
	}
	// Order is kept: the allocator is first-fit.
	if pool.Slices[1].Devices[0].Name != "d-64" {
		t.Errorf("second slice starts with %s", pool.Slices[1].Devices[0].Name)
	}
	if empty := inventory.Resources("n", inventory.Inventory{}).Pools["n"]; len(empty.Slices) != 1 || len(empty.Slices[0].Devices) != 0 {
		t.Errorf("no devices: want one empty slice, got %+v", empty)
	}
}

// unitModes offers a mock DGX H100's GPU 0 as dynamic MIG, 1 as static
// MIG (3g + 2g + 1g + 1g made by the admin), 2 as 3 time-slice replicas,
// 3 shared, the others whole.
func unitModes(t *testing.T, units *bool) (*testEnv, *configapi.NodeConfig) {
	t.Helper()
	e := newTestEnv(t, "dgxh100")
	return e, e.MakeUnitModes(t, units)
}

// milliunits is what a device takes of gpu-milliunits, and from which set.
func milliunits(d resourceapi.Device) (string, int64) {
	for _, c := range d.ConsumesCounters {
		if v, ok := c.Counters[mig.CounterGPUMilliunits]; ok {
			return c.CounterSet, v.Value.Value()
		}
	}
	return "", 0
}

// Every device but a shared one consumes its GPU's share in milliunits
// (rounded down) from its GPU's counter set, which holds 1000; whole GPUs,
// replicas and static MIG from a set of that counter alone.
func TestUnitCountersEveryMode(t *testing.T) {
	e, cfg := unitModes(t, nil)
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)
	pool := inventory.Resources(testNode, inv).Pools[testNode]
	checkPoolValid(t, pool)
	sets := map[string]resourceapi.CounterSet{}
	for _, cs := range inv.CounterSets {
		sets[cs.Name] = cs
		if have := cs.Counters[mig.CounterGPUMilliunits]; have.Value.Value() != mig.GPUMilliunits {
			t.Errorf("counter set %s holds %s milliunits", cs.Name, have.Value.String())
		}
	}
	if len(sets) != 7 { // all but the shared GPU
		t.Errorf("%d counter sets, want 7: %v", len(sets), slices.Collect(maps.Keys(sets)))
	}
	wantStatic := map[string]int64{"3g.40gb": 428, "2g.20gb": 285, "1g.10gb": 142}
	perGPU := map[int]int64{}
	for _, d := range inv.Devices {
		set, milli := milliunits(d.API)
		want := int64(mig.GPUMilliunits)
		switch {
		case d.Type() == device.TypeShared:
			want = 0
		case d.Type() == device.TypeTimeSlice:
			want = 333
		case d.StaticInstance() != nil:
			want = wantStatic[d.StaticInstance().Profile]
		case d.Partition() != nil:
			want = mig.Milliunits(d.Partition().Profile.ComputeSlices, 7)
		}
		if milli != want || (want > 0 && set != mig.CounterSetName(d.GPU.Index)) {
			t.Errorf("%s takes %d milliunits of %q, want %d of %s", d.Name(), milli, set, want, mig.CounterSetName(d.GPU.Index))
		}
		if !d.OnDynamicMIG() && len(d.API.ConsumesCounters) > 0 && len(sets[set].Counters) != 1 {
			t.Errorf("%s consumes set %s, which holds more than GPU milliunits", d.Name(), set)
		}
		if !d.OnDynamicMIG() {
			perGPU[d.GPU.Index] += milli
		}
	}
	// What exists at once (all but dynamic MIG's) fits in each GPU's 1000.
	if want := map[int]int64{1: 997, 2: 999, 3: 0, 4: 1000, 5: 1000, 6: 1000, 7: 1000}; !maps.Equal(perGPU, want) {
		t.Errorf("milliunits per GPU = %v, want %v", perGPU, want)
	}
}

// Unit counters off: whole GPUs, replicas and static MIG consume nothing
// and have no set; dynamic MIG keeps its counters but gpu-milliunits.
func TestUnitCountersOff(t *testing.T) {
	e, cfg := unitModes(t, ptr.To(false))
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)
	checkPoolValid(t, inventory.Resources(testNode, inv).Pools[testNode])
	if len(inv.CounterSets) != 1 || inv.CounterSets[0].Name != mig.CounterSetName(0) {
		t.Fatalf("counter sets %v, want only dynamic GPU 0's", inv.CounterSets)
	}
	if _, ok := inv.CounterSets[0].Counters[mig.CounterGPUMilliunits]; ok {
		t.Error("dynamic GPU's set has gpu-milliunits")
	}
	for _, d := range inv.Devices {
		if _, milli := milliunits(d.API); milli != 0 {
			t.Errorf("%s takes %d milliunits", d.Name(), milli)
		}
		if !d.OnDynamicMIG() && len(d.API.ConsumesCounters) > 0 {
			t.Errorf("%s consumes %v", d.Name(), d.API.ConsumesCounters)
		}
		if d.OnDynamicMIG() && len(d.API.ConsumesCounters) != 1 {
			t.Errorf("dynamic %s consumes %v", d.Name(), d.API.ConsumesCounters)
		}
	}
}

// Per-GPU unit sets of a large node go 8 to a slice (the API's limit),
// and whole GPUs consuming them 64 to a slice.
func TestUnitCounterSetsOfManyGPUs(t *testing.T) {
	var inv inventory.Inventory
	for i := range 70 {
		set := mig.CounterSetName(i)
		inv.CounterSets = append(inv.CounterSets, mig.UnitCounterSet(set))
		inv.Devices = append(inv.Devices, device.AllocatableDevice{API: resourceapi.Device{Name: device.GPUDeviceName(i),
			ConsumesCounters: mig.MilliunitsConsumption(set, mig.GPUMilliunits)}})
	}
	pool := inventory.Resources("n", inv).Pools["n"]
	checkPoolValid(t, pool)
	var sizes []string
	for _, s := range pool.Slices {
		sizes = append(sizes, fmt.Sprintf("%d/%d", len(s.SharedCounters), len(s.Devices)))
	}
	if got := strings.Join(sizes, " "); got != "8/0 8/0 8/0 8/0 8/0 8/0 8/0 8/0 6/0 0/64 0/6" {
		t.Errorf("slices (counter sets/devices) = %s", got)
	}
}

// checkPoolValid checks what the API server validates of a pool's slices
// (k8s.io/api/resource/v1 limits), and that every counter a device
// consumes is published in the pool.
func checkPoolValid(t *testing.T, pool resourceslice.Pool) {
	t.Helper()
	sets := map[string]resourceapi.CounterSet{}
	for i, s := range pool.Slices {
		if len(s.SharedCounters) > 0 && len(s.Devices) > 0 {
			t.Errorf("slice %d holds counter sets and devices", i)
		}
		if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
			t.Errorf("slice %d: %d counter sets", i, len(s.SharedCounters))
		}
		for _, cs := range s.SharedCounters {
			checkCounterSet(t, cs, sets)
			sets[cs.Name] = cs
		}
	}
	for i, s := range pool.Slices {
		limit := resourceapi.ResourceSliceMaxDevices
		if slices.ContainsFunc(s.Devices, func(d resourceapi.Device) bool { return len(d.ConsumesCounters) > 0 }) {
			limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
		if len(s.Devices) > limit {
			t.Errorf("slice %d: %d devices, at most %d allowed", i, len(s.Devices), limit)
		}
		for _, d := range s.Devices {
			checkConsumption(t, d, sets)
		}
	}
}

func checkCounterSet(t *testing.T, cs resourceapi.CounterSet, seen map[string]resourceapi.CounterSet) {
	t.Helper()
	if _, dup := seen[cs.Name]; dup || len(validation.IsDNS1123Label(cs.Name)) > 0 {
		t.Errorf("counter set name %q twice or not a DNS label", cs.Name)
	}
	if n := len(cs.Counters); n == 0 || n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
		t.Errorf("counter set %s: %d counters", cs.Name, n)
	}
	for name := range cs.Counters {
		if len(validation.IsDNS1123Label(name)) > 0 {
			t.Errorf("counter set %s: counter %q not a DNS label", cs.Name, name)
		}
	}
}

func checkConsumption(t *testing.T, d resourceapi.Device, sets map[string]resourceapi.CounterSet) {
	t.Helper()
	if len(d.ConsumesCounters) > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
		t.Errorf("%s: %d counter consumptions", d.Name, len(d.ConsumesCounters))
	}
	seen := map[string]bool{}
	for _, c := range d.ConsumesCounters {
		set, ok := sets[c.CounterSet]
		if !ok || seen[c.CounterSet] {
			t.Errorf("%s consumes counter set %q, unpublished or twice", d.Name, c.CounterSet)
		}
		seen[c.CounterSet] = true
		if n := len(c.Counters); n == 0 || n > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
			t.Errorf("%s: %d counters of %s", d.Name, n, c.CounterSet)
		}
		for name := range c.Counters {
			if _, ok := set.Counters[name]; !ok {
				t.Errorf("%s consumes counter %s that set %s lacks", d.Name, name, c.CounterSet)
			}
		}
	}
}
