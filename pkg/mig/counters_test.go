package mig_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func wholeGPU(l mig.Layout) resourceapi.Device {
	return resourceapi.Device{Name: "gpu-0", ConsumesCounters: l.WholeGPU}
}

// Two placements that share a memory slice can never be allocated
// together; two that do not always can, unless an engine runs out (only
// two "+me" devices: the GPU has one OFA).
func TestCountersPairs(t *testing.T) {
	for _, product := range products {
		l := layout(t, gpu(machine(t, product), 0))
		var engineBound []string
		for i, a := range l.Partitions {
			if !fits(l.CounterSet, a.Device) {
				t.Errorf("%s: %s alone does not fit: %v", product, a.Device.Name, overCommitted(l.CounterSet, a.Device))
			}
			for _, b := range l.Partitions[i+1:] {
				over := overCommitted(l.CounterSet, a.Device, b.Device)
				if a.Placement.Overlaps(b.Placement) {
					if len(over) == 0 {
						t.Errorf("%s: overlapping %s and %s both fit", product, a.Device.Name, b.Device.Name)
					}
					continue
				}
				if len(over) > 0 {
					engineBound = append(engineBound, a.Profile.Name+"+"+b.Profile.Name)
					if a.Profile.OfaEngines == 0 || b.Profile.OfaEngines == 0 {
						t.Errorf("%s: disjoint %s and %s do not fit: %v", product, a.Device.Name, b.Device.Name, over)
					}
				}
			}
		}
		// The "+me" profile has 7 placements: 21 pairs, all refused.
		if len(engineBound) != 21 {
			t.Errorf("%s: %d engine-bound pairs, want the 21 pairs of +me placements: %v", product, len(engineBound), engineBound)
		}
	}
}

// The whole GPU takes every counter: alone it fits, with any MIG device of
// its GPU it does not.
func TestCountersWholeGPU(t *testing.T) {
	for _, product := range products {
		l := layout(t, gpu(machine(t, product), 0))
		whole := wholeGPU(l)
		if !fits(l.CounterSet, whole) {
			t.Fatalf("%s: whole GPU alone does not fit: %v", product, overCommitted(l.CounterSet, whole))
		}
		for name, c := range l.CounterSet.Counters {
			if got := whole.ConsumesCounters[0].Counters[name]; got.Value.Cmp(c.Value) != 0 {
				t.Errorf("%s: whole GPU takes %s of counter %s, set has %s", product, got.Value.String(), name, c.Value.String())
			}
		}
		for _, p := range l.Partitions {
			if fits(l.CounterSet, whole, p.Device) {
				t.Errorf("%s: whole GPU and %s both fit", product, p.Device.Name)
			}
		}
	}
}

// Seven 1g devices fill a GPU's compute: nothing else fits beside them.
func TestCountersFullGPU(t *testing.T) {
	l := layout(t, gpu(machine(t, h100_80), 0))
	var seven []resourceapi.Device
	for _, p := range l.Partitions {
		if p.Profile.Name == "1g.10gb" {
			seven = append(seven, p.Device)
		}
	}
	if len(seven) != 7 || !fits(l.CounterSet, seven...) {
		t.Fatalf("seven 1g.10gb do not fit: %v", overCommitted(l.CounterSet, seven...))
	}
	for _, p := range l.Partitions {
		if fits(l.CounterSet, append(slices.Clone(seven), p.Device)...) {
			t.Errorf("%s fits beside seven 1g.10gb", p.Device.Name)
		}
	}
}

// Whatever set of devices the counters let the scheduler allocate, the GPU
// can create: random first-fit packings are created on the mock, which
// refuses overlapping placements, too many instances of a profile and more
// compute slices than the GPU has, as NVML does.
func TestCountersPackingsAreCreatable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, product := range products {
		s := machine(t, product)
		d := gpu(s, 0)
		migOn(t, d)
		l := layout(t, d)
		for range 200 {
			var picked []mig.Partition
			var devs []resourceapi.Device
			for _, i := range rng.Perm(len(l.Partitions)) {
				p := l.Partitions[i]
				if fits(l.CounterSet, append(devs, p.Device)...) {
					picked, devs = append(picked, p), append(devs, p.Device)
				}
			}
			createAll(t, d, picked)
		}
	}
}

func createAll(t *testing.T, d nvml.Device, picked []mig.Partition) {
	t.Helper()
	var insts []mig.Instance
	for _, p := range picked {
		inst, err := mig.Create(d, p.Profile, p.Placement)
		if err != nil {
			t.Fatalf("counters allowed %v, but creating %s failed: %v", names(picked), p.Device.Name, err)
		}
		insts = append(insts, inst)
	}
	for _, inst := range insts {
		if err := mig.Destroy(d, inst); err != nil {
			t.Fatal(err)
		}
	}
}

func names(ps []mig.Partition) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Device.Name
	}
	return out
}

// An H100's 1g.10gb+me has seven placements but one instance: its
// instance counter stops a second, whatever the other counters say. (The
// GPU's one OFA engine stops a second too, so the published, pruned set
// drops the instance counter: TestPrunedCountersAllowTheSamePackings.)
func TestCountersInstanceLimit(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	l, err := mig.BuildDynamicUnpruned(parentOf(t, d), profiles(t, d), true)
	if err != nil {
		t.Fatal(err)
	}
	var devs []resourceapi.Device
	var p mig.Profile
	for _, part := range l.Partitions {
		if part.Profile.Name == "1g.10gb+me" {
			devs, p = append(devs, part.Device), part.Profile
		}
	}
	if len(devs) != 7 {
		t.Fatalf("%d 1g.10gb+me devices, want one per 1g placement, 7", len(devs))
	}
	if !fits(l.CounterSet, devs[0]) {
		t.Errorf("one 1g.10gb+me does not fit: %v", overCommitted(l.CounterSet, devs[0]))
	}
	if over := overCommitted(l.CounterSet, devs[:2]...); !slices.Contains(over, mig.InstancesCounter(p)) {
		t.Errorf("two 1g.10gb+me exceed %v, want %s among them", over, mig.InstancesCounter(p))
	}
	published := layout(t, d)
	var two []resourceapi.Device
	for _, part := range published.Partitions {
		if part.Profile.Name == "1g.10gb+me" && len(two) < 2 {
			two = append(two, part.Device)
		}
	}
	if fits(published.CounterSet, two...) {
		t.Error("two 1g.10gb+me fit in the published counters")
	}
	// Profiles whose placements already bound them get no such counter: on
	// a real H100 1g.20gb has four two-slice placements for four instances.
	for _, bound := range []string{"instances-1g10gb", "instances-1g20gb"} {
		if _, ok := l.CounterSet.Counters[bound]; ok {
			t.Errorf("%s: a profile with as many placements as instances has an instance counter", bound)
		}
	}
}

// What the API server validates of the counter set and the devices.
func TestCountersAndDevicesValidForAPI(t *testing.T) {
	for _, product := range products {
		s := machine(t, product)
		l := layout(t, gpu(s, 0))
		checkCounterSet(t, product, l)
		// One slice per GPU holds its MIG devices and the whole GPU.
		if n := len(l.Partitions) + 1; n > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("%s: %d devices per GPU, a slice holds %d", product, n, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
		}
		for _, p := range l.Partitions {
			checkDevice(t, p.Device, l.CounterSet)
		}
	}
}

func checkCounterSet(t *testing.T, product string, l mig.Layout) {
	t.Helper()
	if errs := validation.IsDNS1123Label(l.CounterSet.Name); len(errs) > 0 {
		t.Errorf("%s: counter set name %q: %v", product, l.CounterSet.Name, errs)
	}
	if n := len(l.CounterSet.Counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
		t.Errorf("%s: %d counters, at most %d allowed", product, n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
	}
	for name := range l.CounterSet.Counters {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("%s: counter %q: %v", product, name, errs)
		}
	}
}

func checkDevice(t *testing.T, d resourceapi.Device, set resourceapi.CounterSet) {
	t.Helper()
	if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
		t.Errorf("device name %q: %v", d.Name, errs)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%s: %d attributes and capacities, at most %d allowed", d.Name, n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	for name := range d.Attributes {
		checkQualifiedName(t, d.Name, name)
	}
	for name := range d.Capacity {
		checkQualifiedName(t, d.Name, name)
	}
	if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != set.Name {
		t.Fatalf("%s consumes %v, want only set %s", d.Name, d.ConsumesCounters, set.Name)
	}
	for name := range d.ConsumesCounters[0].Counters {
		if _, ok := set.Counters[name]; !ok {
			t.Errorf("%s consumes counter %s the set lacks", d.Name, name)
		}
	}
}

// checkQualifiedName: a C identifier of at most 32 characters, optionally
// after a DNS subdomain and a slash.
func checkQualifiedName(t *testing.T, device string, name resourceapi.QualifiedName) {
	t.Helper()
	id := string(name)
	if domain, rest, ok := strings.Cut(id, "/"); ok {
		if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 {
			t.Errorf("%s: attribute domain %q: %v", device, domain, errs)
		}
		id = rest
	}
	if errs := validation.IsCIdentifier(id); len(errs) > 0 || len(id) > resourceapi.DeviceMaxIDLength {
		t.Errorf("%s: attribute or capacity name %q is not a C identifier of at most %d characters", device, name, resourceapi.DeviceMaxIDLength)
	}
}
