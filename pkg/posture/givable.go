package posture

import (
	resourceapi "k8s.io/api/resource/v1"
)

// Givable returns the names of the node's devices that a claim could be
// given now, as the scheduler sees them: a device not allocated whose
// counters fit in what the GPU's allocated devices leave of its counter
// set (a whole GPU is not free while one of its MIG partitions is taken,
// nor a partition overlapping an allocated one), or a multi-allocatable
// device with room for another share. Taints are not considered: a
// tainted device is out of service, which the posture reports.
func Givable(node string, slices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) map[string]bool {
	p := readPool(node, slices)
	p.addAllocations(claims)
	out := map[string]bool{}
	for _, g := range p.gpus {
		var allocated []*device
		for _, d := range g.devices {
			if len(d.allocs) > 0 {
				allocated = append(allocated, d)
			}
		}
		left := g.budgetOf(p.counterSets, allocated).left
		for _, d := range g.devices {
			out[d.api.Name] = givable(d, left)
		}
	}
	return out
}
