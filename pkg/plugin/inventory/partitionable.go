package inventory

import (
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
)

// WithoutCounters is the inventory as a cluster without partitionable
// devices can take it: no counter sets; no device of a dynamic-MIG GPU, nor
// any other that consumes more than GPU milliunits; the rest less their GPU
// milliunits. It also returns the UUIDs of the GPUs whose devices are left
// out, and how many devices kept lost their GPU milliunits.
func (inv Inventory) WithoutCounters() (Inventory, []string, int) {
	out := Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}}
	var gpus []string
	stripped := 0
	for _, d := range inv.Devices {
		had := len(d.API.ConsumesCounters) > 0
		// d is a copy: the consumption is replaced, never changed in place.
		d.API.ConsumesCounters = mig.WithoutMilliunits(d.API.ConsumesCounters)
		if d.OnDynamicMIG() || len(d.API.ConsumesCounters) > 0 {
			gpus = append(gpus, d.GPU.UUID)
			continue
		}
		if had {
			stripped++
		}
		out.add(d)
	}
	slices.Sort(gpus)
	return out, slices.Compact(gpus), stripped
}

// DeferPlacements moves the dynamic MIG devices that first fit should
// reach only after every GPU's others (mig.Layout.Deferred: the lower 3g
// of each GPU, the only place of 4g) out of their GPU's slice, into slices
// of their own after every other device. The allocator takes a pool's
// slices in order, so a 3g claim then takes the upper half of any GPU that
// has it free before a lower half anywhere (issue 29). A device keeps its
// name and its consumption of its own GPU's counter set: only the slice it
// is listed in changes, which the scheduler's view of allocated devices
// never depends on.
func (inv Inventory) DeferPlacements() Inventory {
	out := Inventory{CounterSets: inv.CounterSets, units: inv.units, ownSlice: map[int]bool{}, layouts: inv.layouts}
	var deferred []device.AllocatableDevice
	newSlice := false // a moved device's slice start passes to the next
	for i, d := range inv.Devices {
		newSlice = newSlice || inv.ownSlice[i]
		if l, part := inv.layouts[d.GPU.UUID], d.Partition(); part != nil && l != nil && l.Deferred(*part) {
			deferred = append(deferred, d)
			continue
		}
		if newSlice {
			out.ownSlice[len(out.Devices)], newSlice = true, false
		}
		out.add(d)
	}
	if len(deferred) > 0 {
		out.ownSlice[len(out.Devices)] = true
		out.add(deferred...)
	}
	if newSlice {
		out.ownSlice[len(out.Devices)] = true
	}
	return out
}
