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
//
// Where the cluster wants counter sets beside their devices (Kubernetes
// 1.34, ForCluster), the devices are grouped by the set they consume
// instead: see besideSlices.
func Resources(nodeName string, inv Inventory) resourceslice.DriverResources {
	if inv.countersBeside {
		return pool(nodeName, besideSlices(inv))
	}
	slices := counterSlices(inv.CounterSets)
	var cur *resourceslice.Slice
	for i, d := range inv.Devices {
		if cur == nil || len(cur.Devices) == MaxDevicesPerSlice || inv.ownSlice[i] && len(cur.Devices) > 0 {
			slices = append(slices, resourceslice.Slice{})
			cur = &slices[len(slices)-1]
		}
		cur.Devices = append(cur.Devices, d.API)
	}
	return pool(nodeName, slices)
}

func pool(nodeName string, slices []resourceslice.Slice) resourceslice.DriverResources {
	if len(slices) == 0 {
		// An empty slice says "driver up, no devices" rather than nothing.
		slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}},
	}
}

// besideSlices lays out the 1.34 way: a device may consume only a counter
// set its own slice defines. Each GPU's devices (all consume its one set)
// go in one slice with that set, in their order; devices that consume
// nothing follow, 64 per slice. A set must not be split over two slices
// (each would count the GPU's capacity anew), so a GPU's devices past the
// 64 a slice holds are not offered; no GPU has that many today (an H100
// offers 29 in dynamic MIG). The deferral of issue 29 is lost: it moved
// devices away from their set.
func besideSlices(inv Inventory) []resourceslice.Slice {
	sets := map[string]resourceapi.CounterSet{}
	for _, cs := range inv.CounterSets {
		sets[cs.Name] = cs
	}
	var out []resourceslice.Slice
	bySet := map[string]int{} // index in out
	var free []resourceapi.Device
	for _, d := range inv.Devices {
		if len(d.API.ConsumesCounters) == 0 {
			free = append(free, d.API)
			continue
		}
		name := d.API.ConsumesCounters[0].CounterSet
		i, ok := bySet[name]
		if !ok {
			i = len(out)
			bySet[name] = i
			out = append(out, resourceslice.Slice{SharedCounters: []resourceapi.CounterSet{sets[name]}})
		}
		if len(out[i].Devices) < MaxDevicesPerSlice {
			out[i].Devices = append(out[i].Devices, d.API)
		}
	}
	for start := 0; start < len(free); start += MaxDevicesPerSlice {
		out = append(out, resourceslice.Slice{Devices: free[start:min(start+MaxDevicesPerSlice, len(free))]})
	}
	return out
}

func counterSlices(sets []resourceapi.CounterSet) []resourceslice.Slice {
	var out []resourceslice.Slice
	for start := 0; start < len(sets); start += resourceapi.ResourceSliceMaxCounterSets {
		end := min(start+resourceapi.ResourceSliceMaxCounterSets, len(sets))
		out = append(out, resourceslice.Slice{SharedCounters: sets[start:end]})
	}
	return out
}
