package inventory

import (
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
)

// WithoutGPUs is the inventory less the devices and counter sets of gpus,
// each slice boundary kept where it was.
func (inv Inventory) WithoutGPUs(gpus map[string]bool) Inventory {
	if len(gpus) == 0 {
		return inv
	}
	sets := map[string]bool{}
	for _, d := range inv.Devices {
		if gpus[d.GPU.UUID] {
			sets[mig.CounterSetName(d.GPU.Index)] = true
		}
	}
	out := inv.without(func(d *device.AllocatableDevice) bool { return gpus[d.GPU.UUID] })
	out.CounterSets = slices.DeleteFunc(slices.Clone(inv.CounterSets), func(cs resourceapi.CounterSet) bool { return sets[cs.Name] })
	return out
}

// without is the inventory less the devices drop says, each slice
// boundary kept where it was; the counter sets stay.
func (inv Inventory) without(drop func(*device.AllocatableDevice) bool) Inventory {
	out := inv
	out.Devices, out.ownSlice = nil, map[int]bool{}
	boundary := false
	for i := range inv.Devices {
		d := &inv.Devices[i]
		boundary = boundary || inv.ownSlice[i]
		if drop(d) {
			continue
		}
		if boundary {
			out.ownSlice[len(out.Devices)] = true
			boundary = false
		}
		out.Devices = append(out.Devices, *d)
	}
	if boundary {
		out.ownSlice[len(out.Devices)] = true // whatever follows starts anew
	}
	return out
}
