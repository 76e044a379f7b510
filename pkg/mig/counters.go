package mig

import (
	"maps"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Counter names of a GPU's counter set. KEP-4815 requires DNS labels.
const (
	CounterComputeSlices   = "compute-slices"
	CounterMultiprocessors = "multiprocessors"
	CounterMemory          = "memory"
	CounterCopyEngines     = "copy-engines"
	CounterDecoders        = "decoders"
	CounterEncoders        = "encoders"
	CounterJpegEngines     = "jpeg-engines"
	CounterOfaEngines      = "ofa-engines"
	// CounterGPUMilliunits is the GPU in thousandths, for Kueue's
	// counter-based DRA quota (KEP-4815 counters; Kueue charges the value
	// a matching device consumes). Every device that stands for a share of
	// one GPU consumes its share; the GPU's set holds GPUMilliunits.
	CounterGPUMilliunits = "gpu-milliunits"
)

// GPUMilliunits is one whole GPU in CounterGPUMilliunits.
const GPUMilliunits = 1000

// Milliunits is part/total of a GPU in thousandths, rounded down: the
// shares of devices that fit on a GPU together (their parts add up to at
// most total) then add up to at most GPUMilliunits, so the counter never
// refuses an allocation the other counters allow. A part above the total
// counts as the whole GPU; no total counts as nothing.
func Milliunits(part, total int) int64 {
	if total <= 0 || part <= 0 {
		return 0
	}
	return GPUMilliunits * int64(min(part, total)) / int64(total)
}

// memorySliceCounters are the names of the first memory-slice counters,
// built once: every device of a node names them.
var memorySliceCounters = func() []string {
	names := make([]string, 16)
	for i := range names {
		names[i] = "memory-slice-" + strconv.Itoa(i)
	}
	return names
}()

// MemorySliceCounter names the counter of memory slice i.
func MemorySliceCounter(i int) string {
	if i < len(memorySliceCounters) {
		return memorySliceCounters[i]
	}
	return "memory-slice-" + strconv.Itoa(i)
}

// InstancesCounter names the counter that caps how many instances of a
// profile exist at once. Only profiles with more placements than instances
// have one (see instanceLimited).
func InstancesCounter(p Profile) string {
	var b strings.Builder
	b.WriteString("instances-")
	writeProfileLabel(&b, p.Name)
	return b.String()
}

// instanceLimited tells whether the memory slices alone would let more
// instances of p exist than the GPU allows. On NVIDIA's GPUs that is the
// "+me" profile (one, at any of seven 1g placements), already capped by the
// OFA counter; the extra counter makes the cap independent of engine counts.
func instanceLimited(p Profile) bool {
	return !p.ComputeVariant && p.MaxInstances > 0 && p.MaxInstances < len(p.Placements)
}

// amounts is one device's (or the GPU's) consumption in counter units.
type amounts struct {
	computeSlices, multiprocessors                           int
	memory                                                   uint64
	copyEngines, decoders, encoders, jpegEngines, ofaEngines int
	placement                                                Placement
	instances                                                map[string]int
	milliunits                                               int64
}

func totalAmounts(t GPUTotals) amounts {
	return amounts{
		computeSlices: t.ComputeSlices, multiprocessors: t.Multiprocessors, memory: t.MemoryBytes,
		copyEngines: t.CopyEngines, decoders: t.Decoders, encoders: t.Encoders,
		jpegEngines: t.JpegEngines, ofaEngines: t.OfaEngines,
		placement:  Placement{Start: 0, Size: t.MemorySlices},
		instances:  t.InstanceLimits,
		milliunits: GPUMilliunits,
	}
}

func profileAmounts(p Profile, pl Placement, t GPUTotals) amounts {
	a := amounts{
		computeSlices: p.ComputeSlices, multiprocessors: p.Multiprocessors, memory: p.MemoryBytes,
		copyEngines: p.CopyEngines, decoders: p.Decoders, encoders: p.Encoders,
		jpegEngines: p.JpegEngines, ofaEngines: p.OfaEngines,
		placement:  pl,
		milliunits: Milliunits(p.ComputeSlices, t.ComputeSlices),
	}
	if instanceLimited(p) {
		a.instances = map[string]int{InstancesCounter(p): 1}
	}
	return a
}

// counters renders amounts. Zero amounts are left out, so the GPU's set has
// no useless counters and a device names only what it takes.
func (a amounts) counters() map[string]resourceapi.Counter {
	c := make(map[string]resourceapi.Counter, a.placement.Size+9+len(a.instances))
	for i := a.placement.Start; i < a.placement.End(); i++ {
		c[MemorySliceCounter(i)] = count(1)
	}
	put(c, CounterComputeSlices, int64(a.computeSlices))
	put(c, CounterMultiprocessors, int64(a.multiprocessors))
	if a.memory > 0 {
		c[CounterMemory] = resourceapi.Counter{Value: *resource.NewQuantity(int64(a.memory), resource.BinarySI)}
	}
	put(c, CounterCopyEngines, int64(a.copyEngines))
	put(c, CounterDecoders, int64(a.decoders))
	put(c, CounterEncoders, int64(a.encoders))
	put(c, CounterJpegEngines, int64(a.jpegEngines))
	put(c, CounterOfaEngines, int64(a.ofaEngines))
	for name, n := range a.instances {
		put(c, name, int64(n))
	}
	put(c, CounterGPUMilliunits, a.milliunits)
	return c
}

func put(c map[string]resourceapi.Counter, name string, v int64) {
	if v > 0 {
		c[name] = count(v)
	}
}

func count(v int64) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
}

// CounterSet describes one GPU for KEP-4815: one counter per memory slice,
// by position, so that two placements sharing a slice can never both be
// allocated, plus the GPU's compute slices, multiprocessors, memory and
// engines, so that engine-bound profiles ("+me" takes the only OFA) cannot
// over-commit either, plus an instance cap for profiles that need one, plus
// the GPU's milliunits for Kueue.
func CounterSet(name string, totals GPUTotals) resourceapi.CounterSet {
	return resourceapi.CounterSet{Name: name, Counters: totalAmounts(totals).counters()}
}

// MigDeviceConsumption is what a MIG device at a placement takes from its
// GPU's counter set; totals are the GPU's, for its share in milliunits.
func MigDeviceConsumption(counterSet string, p Profile, pl Placement, totals GPUTotals) []resourceapi.DeviceCounterConsumption {
	return []resourceapi.DeviceCounterConsumption{{
		CounterSet: counterSet,
		Counters:   profileAmounts(p, pl, totals).counters(),
	}}
}

// WholeGPUConsumption takes every counter of the set, so the whole GPU and
// any MIG device of it are never allocated together.
func WholeGPUConsumption(counterSet string, totals GPUTotals) []resourceapi.DeviceCounterConsumption {
	return []resourceapi.DeviceCounterConsumption{{
		CounterSet: counterSet,
		Counters:   totalAmounts(totals).counters(),
	}}
}

// UnitCounterSet is the counter set of a GPU offered whole, as time-slice
// replicas or as static MIG: only its GPUMilliunits. Nothing else needs
// counting there (the devices cannot overlap), so it exists for Kueue's
// counter-based quota alone.
func UnitCounterSet(name string) resourceapi.CounterSet {
	return resourceapi.CounterSet{Name: name, Counters: map[string]resourceapi.Counter{
		CounterGPUMilliunits: count(GPUMilliunits),
	}}
}

// MilliunitsConsumption is a device taking milli GPU milliunits of a unit
// counter set (see UnitCounterSet). No set (unit counters off) or no share
// is nil, as the API refuses a consumption without counters.
func MilliunitsConsumption(counterSet string, milli int64) []resourceapi.DeviceCounterConsumption {
	if counterSet == "" || milli <= 0 {
		return nil
	}
	return []resourceapi.DeviceCounterConsumption{{
		CounterSet: counterSet,
		Counters:   map[string]resourceapi.Counter{CounterGPUMilliunits: count(milli)},
	}}
}

// WithoutMilliunits is consumes less the GPU milliunits counter. Entries
// left with no counter are dropped (the API refuses them), so a device that
// only consumed units consumes nothing. consumes itself is not changed: it
// may be a published device's.
func WithoutMilliunits(consumes []resourceapi.DeviceCounterConsumption) []resourceapi.DeviceCounterConsumption {
	var out []resourceapi.DeviceCounterConsumption
	for _, c := range consumes {
		counters := maps.Clone(c.Counters)
		delete(counters, CounterGPUMilliunits)
		if len(counters) > 0 {
			out = append(out, resourceapi.DeviceCounterConsumption{CounterSet: c.CounterSet, Counters: counters})
		}
	}
	return out
}

// Withhold takes consumptions out of a counter set: the share of MIG
// devices that exist but that no claim holds, which the scheduler must not
// hand out again. Counters that run out stay in the set at zero (the API
// accepts any quantity), so the devices naming them stay valid and simply
// never fit.
func Withhold(set resourceapi.CounterSet, taken []resourceapi.DeviceCounterConsumption) resourceapi.CounterSet {
	out := resourceapi.CounterSet{Name: set.Name, Counters: make(map[string]resourceapi.Counter, len(set.Counters))}
	for name, c := range set.Counters {
		out.Counters[name] = resourceapi.Counter{Value: c.Value.DeepCopy()}
	}
	for _, t := range taken {
		if t.CounterSet != set.Name {
			continue
		}
		for name, c := range t.Counters {
			have, ok := out.Counters[name]
			if !ok {
				continue
			}
			have.Value.Sub(c.Value)
			if have.Value.Sign() < 0 {
				have.Value = *resource.NewQuantity(0, have.Value.Format)
			}
			out.Counters[name] = have
		}
	}
	return out
}

// Fits reports whether a device's consumption of the set fits in what the
// set has.
func Fits(set resourceapi.CounterSet, consumes []resourceapi.DeviceCounterConsumption) bool {
	for _, c := range consumes {
		if c.CounterSet != set.Name {
			continue
		}
		for name, need := range c.Counters {
			have, ok := set.Counters[name]
			if !ok || have.Value.Cmp(need.Value) < 0 {
				return false
			}
		}
	}
	return true
}
