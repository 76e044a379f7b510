package posture

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// memorySliceCounterPrefix names a dynamic MIG GPU's memory-slice counters
// ("memory-slice-<i>", see pkg/mig/counters.go): one per slice by position,
// so the slices a partition takes say where it sits.
const memorySliceCounterPrefix = "memory-slice-"

// counterGPUMilliunits is the counter every device but a shared one
// consumes for Kueue (pkg/mig CounterGPUMilliunits): its share of its GPU.
// Devices of a GPU that is not dynamic MIG consume nothing else.
const counterGPUMilliunits = "gpu-milliunits"

// allocation is one claim's hold on a device.
type allocation struct {
	// claim is namespace/name.
	claim string
	// consumed is the capacity a share of a multi-allocatable device took.
	consumed map[resourceapi.QualifiedName]resource.Quantity
}

// addAllocations records which claims hold which of the pool's devices.
// AdminAccess results are left out: they monitor a device alongside its
// user and take nothing from it. Results naming a device the pool no
// longer publishes are left out too: the GPU they were on is not known.
func (p *pool) addAllocations(claims []resourceapi.ResourceClaim) {
	for i := range claims {
		c := &claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		name := c.Namespace + "/" + c.Name
		all := allModeRequests(c)
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != DriverName || r.Pool != p.name || (r.AdminAccess != nil && *r.AdminAccess) {
				continue
			}
			if d := p.devices[r.Device]; d != nil {
				d.allocs = append(d.allocs, allocation{claim: name, consumed: r.ConsumedCapacity})
				if all[r.Request] {
					p.leases[name] = true
				}
			}
		}
	}
}

// allModeRequests are the names of a claim's requests with allocationMode
// All, as its allocation results name them: "req", or "req/sub" for a
// subrequest of firstAvailable.
func allModeRequests(c *resourceapi.ResourceClaim) map[string]bool {
	out := map[string]bool{}
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil && r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll {
			out[r.Name] = true
		}
		for _, sub := range r.FirstAvailable {
			if sub.AllocationMode == resourceapi.DeviceAllocationModeAll {
				out[r.Name+"/"+sub.Name] = true
			}
		}
	}
	return out
}

// allocationPosture is the posture of a GPU no taint keeps out of service.
func (g *gpu) allocationPosture(sets map[string]resourceapi.CounterSet, mode gpuaas.GpuMode) (gpuaas.Posture, string) {
	var allocated []*device
	for _, d := range g.devices {
		if len(d.allocs) == 0 {
			continue
		}
		if d.typ == string(gpuaas.DeviceTypeGPU) {
			return gpuaas.PostureAllocatedWhole, fmt.Sprintf("whole GPU %s allocated to %s", d.api.Name, strings.Join(g.claims(), ", "))
		}
		allocated = append(allocated, d)
	}
	b := g.budgetOf(sets, allocated)
	if len(allocated) == 0 {
		return gpuaas.PostureAvailable, g.freeReason(mode, b)
	}
	posture := gpuaas.PostureFullyAllocated
	if g.roomLeft(b.left) {
		posture = gpuaas.PosturePartiallyAllocated
	}
	return posture, g.allocatedReason(mode, allocated, b)
}

// counters is a counter set's values by counter name.
type counters map[string]resource.Quantity

// budget is, for each counter set the GPU's devices consume, what the
// pool publishes and what is left of it after the allocated devices.
type budget struct {
	published, left map[string]counters
}

// budgetOf works out the GPU's counters. An allocated device's counters
// are taken once, however many shares of it are allocated (the plugin's
// multi-allocatable devices consume no counters, not even GPU milliunits,
// so it never matters for them today).
func (g *gpu) budgetOf(sets map[string]resourceapi.CounterSet, allocated []*device) budget {
	b := budget{published: map[string]counters{}, left: map[string]counters{}}
	for _, d := range g.devices {
		for _, c := range d.api.ConsumesCounters {
			if _, seen := b.published[c.CounterSet]; seen {
				continue
			}
			pub, left := counters{}, counters{}
			for name, v := range sets[c.CounterSet].Counters {
				pub[name], left[name] = v.Value.DeepCopy(), v.Value.DeepCopy()
			}
			b.published[c.CounterSet], b.left[c.CounterSet] = pub, left
		}
	}
	for _, d := range allocated {
		for _, c := range d.api.ConsumesCounters {
			set := b.left[c.CounterSet]
			for name, need := range c.Counters {
				if have, ok := set[name]; ok {
					have.Sub(need.Value)
					set[name] = have
				}
			}
		}
	}
	return b
}

// fits reports whether a device's counters fit in what remains. A counter
// the set does not publish never fits: the scheduler would not allocate
// the device either.
func fits(consumes []resourceapi.DeviceCounterConsumption, remaining map[string]counters) bool {
	for _, c := range consumes {
		set, ok := remaining[c.CounterSet]
		if !ok {
			return false
		}
		for name, need := range c.Counters {
			have, ok := set[name]
			if !ok || have.Cmp(need.Value) < 0 {
				return false
			}
		}
	}
	return true
}

// roomLeft reports whether one more device of the GPU could be allocated:
// an unallocated device whose counters fit, or a share of a
// multi-allocatable device that still fits in its capacity.
func (g *gpu) roomLeft(remaining map[string]counters) bool {
	return slices.ContainsFunc(g.devices, func(d *device) bool { return givable(d, remaining) })
}

// givable reports whether a claim could be given d now: a share of a
// multi-allocatable device that still fits in its capacity, or a device
// nobody holds whose counters fit in what remains.
func givable(d *device, remaining map[string]counters) bool {
	multi := d.api.AllowMultipleAllocations != nil && *d.api.AllowMultipleAllocations
	if multi && len(d.allocs) > 0 {
		return shareFits(d)
	}
	return len(d.allocs) == 0 && fits(d.api.ConsumesCounters, remaining)
}

// shareFits reports whether another share fits in every capacity of a
// multi-allocatable device: what is left is at least the smallest amount
// its request policy accepts (any amount above zero without a policy).
func shareFits(d *device) bool {
	for name, c := range d.api.Capacity {
		left := capacityLeft(d, name, c)
		if left.Sign() <= 0 || left.Cmp(smallestShare(c.RequestPolicy)) < 0 {
			return false
		}
	}
	return true
}

// capacityLeft is a capacity of a multi-allocatable device less what its
// shares consumed. A share that recorded no consumption took the policy's
// default, or all of it without a policy, as the allocator does.
func capacityLeft(d *device, name resourceapi.QualifiedName, c resourceapi.DeviceCapacity) resource.Quantity {
	left := c.Value.DeepCopy()
	for _, a := range d.allocs {
		used, ok := a.consumed[name]
		if !ok {
			used, ok = a.consumed[resourceapi.QualifiedName(DriverName+"/"+string(name))]
		}
		switch {
		case ok:
		case c.RequestPolicy != nil && c.RequestPolicy.Default != nil:
			used = *c.RequestPolicy.Default
		default:
			used = c.Value
		}
		left.Sub(used)
	}
	return left
}

func smallestShare(p *resourceapi.CapacityRequestPolicy) resource.Quantity {
	switch {
	case p == nil:
	case len(p.ValidValues) > 0:
		return p.ValidValues[0]
	case p.ValidRange != nil && p.ValidRange.Min != nil:
		return *p.ValidRange.Min
	}
	return resource.Quantity{}
}

// freeReason says what a GPU with nothing allocated offers.
func (g *gpu) freeReason(mode gpuaas.GpuMode, b budget) string {
	switch mode {
	case gpuaas.GpuModeTimeSliced:
		return plural(g.countType(gpuaas.DeviceTypeTimeSlice), "replica") + " free"
	case gpuaas.GpuModeMigStatic:
		return plural(g.countType(gpuaas.DeviceTypeMIG), "MIG device") + " free"
	case gpuaas.GpuModeMigDynamic:
		return "nothing allocated: " + memorySlicesReason(b)
	case gpuaas.GpuModeShared:
		if d := g.firstOfType(gpuaas.DeviceTypeShared); d != nil {
			return memoryLeftReason(d) + " free"
		}
	}
	return "whole GPU free"
}

// allocatedReason says what is allocated and what is left.
func (g *gpu) allocatedReason(mode gpuaas.GpuMode, allocated []*device, b budget) string {
	switch mode {
	case gpuaas.GpuModeTimeSliced:
		return fmt.Sprintf("%d of %s allocated", len(allocated), plural(g.countType(gpuaas.DeviceTypeTimeSlice), "replica"))
	case gpuaas.GpuModeMigStatic:
		free := g.countType(gpuaas.DeviceTypeMIG) - len(allocated)
		return fmt.Sprintf("%s allocated: %d of %s free", partitionNames(allocated), free, plural(g.countType(gpuaas.DeviceTypeMIG), "MIG device"))
	case gpuaas.GpuModeMigDynamic:
		reason := partitionNames(allocated) + " allocated: " + memorySlicesReason(b)
		if !g.roomLeft(b.left) && freeMemorySlices(b.left) > 0 {
			reason += ", but no partition fits in them"
		}
		return reason
	case gpuaas.GpuModeShared:
		if d := g.firstOfType(gpuaas.DeviceTypeShared); d != nil {
			reason := fmt.Sprintf("%s allocated: %s free", plural(len(d.allocs), "share"), memoryLeftReason(d))
			if !shareFits(d) {
				reason += ", less than the smallest share"
			}
			return reason
		}
	}
	return fmt.Sprintf("%d of %s allocated", len(allocated), plural(len(g.devices), "device"))
}

func (g *gpu) countType(t gpuaas.DeviceType) int {
	n := 0
	for _, d := range g.devices {
		if d.typ == string(t) {
			n++
		}
	}
	return n
}

func (g *gpu) firstOfType(t gpuaas.DeviceType) *device {
	for _, d := range g.devices {
		if d.typ == string(t) {
			return d
		}
	}
	return nil
}

// partitionNames lists MIG devices as profile@first-memory-slice (where a
// dynamic partition sits, from the memory slices it consumes), or by
// device name when its placement is not published (static MIG).
func partitionNames(devs []*device) string {
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		profile := stringAttr(d.api, attrProfile)
		start, ok := firstMemorySlice(d.api.ConsumesCounters)
		switch {
		case profile != "" && ok:
			names = append(names, fmt.Sprintf("%s@%d", profile, start))
		case profile != "":
			names = append(names, fmt.Sprintf("%s (%s)", profile, d.api.Name))
		default:
			names = append(names, d.api.Name)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func firstMemorySlice(consumes []resourceapi.DeviceCounterConsumption) (int, bool) {
	first, found := 0, false
	for _, c := range consumes {
		for name := range c.Counters {
			i, ok := memorySliceIndex(name)
			if ok && (!found || i < first) {
				first, found = i, true
			}
		}
	}
	return first, found
}

func memorySliceIndex(counter string) (int, bool) {
	rest, ok := strings.CutPrefix(counter, memorySliceCounterPrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil
}

// memorySlicesReason is e.g. "3 of 8 memory slices free", plus how many
// the plugin withholds: the slices of MIG instances that exist while no
// claim holds them, which it publishes at zero so the scheduler leaves them
// alone (pkg/mig Withhold).
func memorySlicesReason(b budget) string {
	var total, withheld int
	for _, set := range b.published {
		for name, v := range set {
			if _, ok := memorySliceIndex(name); ok {
				total++
				if v.Sign() <= 0 {
					withheld++
				}
			}
		}
	}
	reason := fmt.Sprintf("%d of %d memory slices free", freeMemorySlices(b.left), total)
	if withheld > 0 {
		reason += fmt.Sprintf(" (%d withheld by the plugin)", withheld)
	}
	return reason
}

func freeMemorySlices(remaining map[string]counters) int {
	free := 0
	for _, set := range remaining {
		for name, v := range set {
			if _, ok := memorySliceIndex(name); ok && v.Sign() > 0 {
				free++
			}
		}
	}
	return free
}

// memoryLeftReason is e.g. "40Gi of 80Gi memory" for a shared device.
func memoryLeftReason(d *device) string {
	c, ok := d.api.Capacity["memory"]
	if !ok {
		return "capacity"
	}
	left := capacityLeft(d, "memory", c)
	return fmt.Sprintf("%s of %s memory", left.String(), c.Value.String())
}
