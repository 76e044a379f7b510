package inventory

import (
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	resourceapi "k8s.io/api/resource/v1"
)

// WithoutGPUs is the inventory less the devices and counter sets of gpus,
// each slice boundary kept where it was.
func (inv Inventory) WithoutGPUs(gpus map[string]bool) Inventory {
	if len(gpus) == 0 {
		return inv
	}
	out := inv
	out.Devices, out.ownSlice = nil, map[int]bool{}
	sets := map[string]bool{}
	boundary := false
	for i, d := range inv.Devices {
		boundary = boundary || inv.ownSlice[i]
		if gpus[d.GPU.UUID] {
			sets[mig.CounterSetName(d.GPU.Index)] = true
			continue
		}
		if boundary {
			out.ownSlice[len(out.Devices)] = true
			boundary = false
		}
		out.Devices = append(out.Devices, d)
	}
	if boundary {
		out.ownSlice[len(out.Devices)] = true // whatever follows starts anew
	}
	out.CounterSets = slices.DeleteFunc(slices.Clone(inv.CounterSets), func(cs resourceapi.CounterSet) bool { return sets[cs.Name] })
	return out
}
