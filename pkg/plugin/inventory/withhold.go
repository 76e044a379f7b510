package inventory

import (
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
)

// Withhold takes the share of unowned GPU instances out of their GPUs'
// counter sets, so the scheduler cannot over-commit what is left, and
// leaves out the devices that no longer fit: those at or overlapping their
// placements, the whole GPU, any that needs an engine they hold. It
// returns the names of the devices left out.
func (inv Inventory) Withhold(unowned map[string][]mig.GPUInstance) (Inventory, []string) {
	sets := map[string]resourceapi.CounterSet{}
	for uuid, gis := range unowned {
		if l := inv.layouts[uuid]; l != nil && len(gis) > 0 {
			sets[l.CounterSet.Name] = l.Remaining(gis)
		}
	}
	if len(sets) == 0 {
		return inv, nil
	}
	out := Inventory{ownSlice: map[int]bool{}, layouts: inv.layouts, units: inv.units}
	for _, cs := range inv.CounterSets {
		if remaining, ok := sets[cs.Name]; ok {
			cs = remaining
		}
		out.CounterSets = append(out.CounterSets, cs)
	}
	var dropped []string
	newSlice := false // a left-out device's slice start passes to the next
	for i, d := range inv.Devices {
		newSlice = newSlice || inv.ownSlice[i]
		if !fitsRemaining(d, sets) {
			dropped = append(dropped, d.Name())
			continue
		}
		if newSlice {
			out.ownSlice[len(out.Devices)], newSlice = true, false
		}
		out.add(d)
	}
	if newSlice {
		out.ownSlice[len(out.Devices)] = true
	}
	return out, dropped
}

// fitsRemaining reports whether a device's consumption fits in what is
// left of the counter sets it draws on.
func fitsRemaining(d device.AllocatableDevice, sets map[string]resourceapi.CounterSet) bool {
	for _, c := range d.API.ConsumesCounters {
		if set, ok := sets[c.CounterSet]; ok && !mig.Fits(set, d.API.ConsumesCounters) {
			return false
		}
	}
	return true
}
