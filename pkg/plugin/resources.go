package plugin

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// MaxDevicesPerSlice is the API's limit for slices whose devices use
// counters or taints; we keep to it everywhere so a later feature never
// has to reshape slices.
const MaxDevicesPerSlice = 64

// Resources builds the node's single pool (named after the node) from the
// devices in their preferred order: the allocator is first-fit in slice and
// device order.
func Resources(nodeName string, devices []AllocatableDevice) resourceslice.DriverResources {
	var slices []resourceslice.Slice
	for start := 0; start < len(devices); start += MaxDevicesPerSlice {
		end := min(start+MaxDevicesPerSlice, len(devices))
		slice := resourceslice.Slice{Devices: make([]resourceapi.Device, 0, end-start)}
		for i := start; i < end; i++ {
			slice.Devices = append(slice.Devices, devices[i].API)
		}
		slices = append(slices, slice)
	}
	if len(slices) == 0 {
		// An empty slice says "driver up, no devices" rather than nothing.
		slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}},
	}
}
