package mig_test

import (
	"maps"
	"reflect"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func milliunitsOf(t *testing.T, consumes []resourceapi.DeviceCounterConsumption) int64 {
	t.Helper()
	var sum int64
	for _, c := range consumes {
		if v, ok := c.Counters[mig.CounterGPUMilliunits]; ok {
			sum += v.Value.Value()
		}
	}
	return sum
}

// The values Kueue charges: thousandths of a GPU, rounded down.
func TestMilliunits(t *testing.T) {
	for _, tc := range []struct {
		part, total int
		want        int64
	}{{1, 7, 142}, {2, 7, 285}, {3, 7, 428}, {4, 7, 571}, {7, 7, 1000}, {1, 4, 250}, {8, 7, 1000}, {0, 7, 0}, {1, 0, 0}} {
		if got := mig.Milliunits(tc.part, tc.total); got != tc.want {
			t.Errorf("Milliunits(%d, %d) = %d, want %d", tc.part, tc.total, got, tc.want)
		}
	}
	if errs := validation.IsDNS1123Label(mig.CounterGPUMilliunits); len(errs) > 0 {
		t.Errorf("counter name %q: %v", mig.CounterGPUMilliunits, errs)
	}
}

// A dynamic GPU's set holds 1000 milliunits, the whole GPU takes them all,
// a partition floor(1000 * its compute slices / the GPU's).
func TestDynamicMilliunits(t *testing.T) {
	want := map[int]int64{1: 142, 2: 285, 3: 428, 4: 571, 7: 1000}
	for _, product := range products {
		l := layout(t, gpu(machine(t, product), 0))
		if got := l.CounterSet.Counters[mig.CounterGPUMilliunits]; got.Value.Value() != mig.GPUMilliunits {
			t.Errorf("%s: counter set holds %s milliunits", product, got.Value.String())
		}
		if got := milliunitsOf(t, l.WholeGPU); got != mig.GPUMilliunits {
			t.Errorf("%s: whole GPU takes %d milliunits", product, got)
		}
		if l.Totals.ComputeSlices != 7 {
			t.Fatalf("%s: %d compute slices, the mocks have 7", product, l.Totals.ComputeSlices)
		}
		for _, p := range l.Partitions {
			if got := milliunitsOf(t, p.Device.ConsumesCounters); got != want[p.Profile.ComputeSlices] {
				t.Errorf("%s: %s takes %d milliunits, want %d", product, p.Device.Name, got, want[p.Profile.ComputeSlices])
			}
		}
	}
}

// Without unit counters a dynamic layout is the same, less gpu-milliunits.
func TestDynamicWithoutUnits(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	with := layout(t, d)
	without, err := mig.BuildDynamic(parentOf(t, d), profiles(t, d), false)
	if err != nil {
		t.Fatal(err)
	}
	wantSet := maps.Clone(with.CounterSet.Counters)
	delete(wantSet, mig.CounterGPUMilliunits)
	if !reflect.DeepEqual(without.CounterSet.Counters, wantSet) {
		t.Errorf("counter set without units: %v", without.CounterSet.Counters)
	}
	if !reflect.DeepEqual(without.WholeGPU, mig.WithoutMilliunits(with.WholeGPU)) {
		t.Errorf("whole GPU without units consumes %v", without.WholeGPU)
	}
	for i, p := range without.Partitions {
		if !reflect.DeepEqual(p.Device.ConsumesCounters, mig.WithoutMilliunits(with.Partitions[i].Device.ConsumesCounters)) {
			t.Errorf("%s without units consumes %v", p.Device.Name, p.Device.ConsumesCounters)
		}
	}
}

// The proof that the counter changes nothing for the scheduler: every set
// of partitions that the counters without gpu-milliunits let it allocate
// together, every one the GPU allows, fits with it too, and its milliunits
// (static or dynamic) add up to at most 1000. Sets that did not fit before
// cannot fit now: the counter only adds a constraint.
func TestMilliunitsNeverRefuseAnAllocation(t *testing.T) {
	for _, product := range products {
		d := gpu(machine(t, product), 0)
		ps := profiles(t, d)
		with := layout(t, d)
		without, err := mig.BuildDynamic(parentOf(t, d), ps, false)
		if err != nil {
			t.Fatal(err)
		}
		e := enumeration{t: t, product: product, with: with, without: without, totals: mig.Totals(ps),
			variants: smallestVariants(ps), used: map[string]int64{}}
		e.walk(0, nil)
		// A 7-slice GPU has hundreds of packings; a bug in walk must not
		// make the test vacuous.
		if e.sets < 100 {
			t.Errorf("%s: only %d packings walked", product, e.sets)
		}
		t.Logf("%s: %d packings, all within %d milliunits", product, e.sets, mig.GPUMilliunits)
	}
}

// enumeration walks every set of partitions that fits in the counters
// without gpu-milliunits, adding one partition at a time in layout order.
type enumeration struct {
	t             *testing.T
	product       string
	with, without mig.Layout
	totals        mig.GPUTotals
	variants      map[int]mig.Profile
	used          map[string]int64
	sets          int
}

func (e *enumeration) walk(from int, picked []int) {
	e.sets++
	e.check(picked)
	for i := from; i < len(e.without.Partitions); i++ {
		c := e.without.Partitions[i].Device.ConsumesCounters[0].Counters
		if !e.fits(c) {
			continue
		}
		e.add(c, 1)
		e.walk(i+1, append(picked, i))
		e.add(c, -1)
	}
}

func (e *enumeration) fits(c map[string]resourceapi.Counter) bool {
	for name, v := range c {
		have := e.without.CounterSet.Counters[name]
		if e.used[name]+v.Value.Value() > have.Value.Value() {
			return false
		}
	}
	return true
}

func (e *enumeration) add(c map[string]resourceapi.Counter, sign int64) {
	for name, v := range c {
		e.used[name] += sign * v.Value.Value()
	}
}

// check: the dynamic devices' milliunits, the same packing's as static
// devices, and the packing with every GPU instance split into its smallest
// compute instances (static MIG offers each of them), all fit in 1000.
func (e *enumeration) check(picked []int) {
	var dynamic, static, split int64
	for _, i := range picked {
		p := e.with.Partitions[i]
		dynamic += milliunitsOf(e.t, p.Device.ConsumesCounters)
		static += mig.StaticMilliunits(p.Profile, e.totals)
		split += e.splitMilliunits(p.Profile)
	}
	for name, sum := range map[string]int64{"dynamic": dynamic, "static": static, "split into compute instances": split} {
		if sum > mig.GPUMilliunits {
			e.t.Fatalf("%s: %s packing %v takes %d milliunits", e.product, name, e.names(picked), sum)
		}
	}
}

// splitMilliunits is a GPU instance of p split into as many of its
// smallest compute variant as fit, as static devices.
func (e *enumeration) splitMilliunits(p mig.Profile) int64 {
	v, ok := e.variants[p.GIProfileID]
	if !ok {
		return mig.StaticMilliunits(p, e.totals)
	}
	return int64(p.ComputeSlices/v.CIComputeSlices) * mig.StaticMilliunits(v, e.totals)
}

func (e *enumeration) names(picked []int) []string {
	out := make([]string, len(picked))
	for j, i := range picked {
		out[j] = e.with.Partitions[i].Device.Name
	}
	return out
}

// smallestVariants maps a GPU-instance profile to its compute variant with
// the fewest compute slices.
func smallestVariants(ps []mig.Profile) map[int]mig.Profile {
	out := map[int]mig.Profile{}
	for _, p := range ps {
		if v, ok := out[p.GIProfileID]; p.ComputeVariant && (!ok || p.CIComputeSlices < v.CIComputeSlices) {
			out[p.GIProfileID] = p
		}
	}
	return out
}

// Static MIG devices consume their compute instance's share from their
// GPU's unit-only set: two 1c compute instances of one 2g GPU instance
// take 142 each, not the GPU instance's 285 each.
func TestStaticMilliunits(t *testing.T) {
	d := gpu(machine(t, a100_40), 0)
	migOn(t, d)
	ps := profiles(t, d)
	totals := mig.Totals(ps)
	set := mig.UnitCounterSet(mig.CounterSetName(0))
	for name, want := range map[string]int64{"1g.5gb": 142, "3g.20gb": 428, "7g.40gb": 1000, "1c.2g.10gb": 142, "1c.3g.20gb": 142, "2c.3g.20gb": 285} {
		p := profileNamed(t, ps, name)
		dev := mig.StaticDevice(parentOf(t, d), p, mig.Instance{Profile: name}, totals, set.Name)
		if got := milliunitsOf(t, dev.ConsumesCounters); got != want || len(dev.ConsumesCounters) != 1 || dev.ConsumesCounters[0].CounterSet != set.Name {
			t.Errorf("static %s consumes %v, want %d milliunits of %s", name, dev.ConsumesCounters, want, set.Name)
		}
		if off := mig.StaticDevice(parentOf(t, d), p, mig.Instance{Profile: name}, totals, ""); off.ConsumesCounters != nil {
			t.Errorf("static %s without a unit set consumes %v", name, off.ConsumesCounters)
		}
	}
}

func TestUnitCounterSetAndConsumption(t *testing.T) {
	set := mig.UnitCounterSet("gpu-3-counters")
	if have := set.Counters[mig.CounterGPUMilliunits]; len(set.Counters) != 1 || have.Value.Value() != 1000 {
		t.Errorf("unit counter set = %v", set)
	}
	if c := mig.MilliunitsConsumption(set.Name, 333); len(c) != 1 || c[0].CounterSet != set.Name || milliunitsOf(t, c) != 333 || len(c[0].Counters) != 1 {
		t.Errorf("consumption = %v", c)
	}
	if c := mig.MilliunitsConsumption("", 333); c != nil {
		t.Errorf("no set: consumption %v", c)
	}
	if c := mig.MilliunitsConsumption(set.Name, 0); c != nil {
		t.Errorf("no share: consumption %v", c)
	}
}

// WithoutMilliunits leaves the other counters, drops what is left empty,
// and changes nothing it was given.
func TestWithoutMilliunits(t *testing.T) {
	l := layout(t, gpu(machine(t, h100_80), 0))
	dev := l.Partitions[0].Device
	n := len(dev.ConsumesCounters[0].Counters)
	got := mig.WithoutMilliunits(dev.ConsumesCounters)
	if len(got) != 1 || len(got[0].Counters) != n-1 || len(dev.ConsumesCounters[0].Counters) != n {
		t.Errorf("without milliunits: %d counters of %d (input now %d)", len(got[0].Counters), n, len(dev.ConsumesCounters[0].Counters))
	}
	if _, ok := got[0].Counters[mig.CounterGPUMilliunits]; ok {
		t.Error("gpu-milliunits left in")
	}
	units := mig.MilliunitsConsumption("gpu-0-counters", 1000)
	if got := mig.WithoutMilliunits(units); got != nil || milliunitsOf(t, units) != 1000 {
		t.Errorf("unit-only consumption without milliunits = %v", got)
	}
}
