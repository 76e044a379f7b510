package inventory

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// MaxDevicesPerSlice is the API's limit for slices whose devices use
// counters or taints; we keep to it everywhere so a later feature never
// has to reshape slices.
const MaxDevicesPerSlice = 64

// Resources builds the node's single pool (named after the node): counter
// sets first, in slices of their own as the API requires, then the devices
// in their preferred order (the allocator is first-fit in slice and device
// order), at most 64 per slice, each dynamic MIG GPU in its own slice but
// for its deferred placements, which follow in a slice of their own
// (DeferPlacements, issue 29).
func Resources(nodeName string, inv Inventory) resourceslice.DriverResources {
	slices := counterSlices(inv.CounterSets)
	var cur *resourceslice.Slice
	for i, d := range inv.Devices {
		if cur == nil || len(cur.Devices) == MaxDevicesPerSlice || inv.ownSlice[i] && len(cur.Devices) > 0 {
			slices = append(slices, resourceslice.Slice{})
			cur = &slices[len(slices)-1]
		}
		cur.Devices = append(cur.Devices, d.API)
	}
	if len(slices) == 0 {
		// An empty slice says "driver up, no devices" rather than nothing.
		slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}},
	}
}

func counterSlices(sets []resourceapi.CounterSet) []resourceslice.Slice {
	var out []resourceslice.Slice
	for start := 0; start < len(sets); start += resourceapi.ResourceSliceMaxCounterSets {
		end := min(start+resourceapi.ResourceSliceMaxCounterSets, len(sets))
		out = append(out, resourceslice.Slice{SharedCounters: sets[start:end]})
	}
	return out
}
