package posture

import (
	"slices"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Status renders the posture as a GpuNode's status. ObservedTime is left
// to the caller: it changes only when the rest does.
func (n *NodePosture) Status() gpuaas.GpuNodeStatus {
	s := gpuaas.GpuNodeStatus{Posture: n.Posture, Reason: n.Reason, Summary: n.summary()}
	for _, g := range n.GPUs {
		s.GPUs = append(s.GPUs, gpuaas.GpuPosture{
			Index: int32(g.Index), UUID: g.UUID, ProductName: g.ProductName, Mode: g.Mode,
			Posture: g.Posture, Reason: g.Reason, Devices: int32(len(g.Devices)),
			AllocatedDevices: slices.Clone(g.Allocated), Claims: slices.Clone(g.Claims), MemoryLimit: g.MemoryLimit,
		})
	}
	return s
}

func (n *NodePosture) summary() gpuaas.PostureSummary {
	c := func(p gpuaas.Posture) int32 { return int32(n.Counts[p]) }
	return gpuaas.PostureSummary{
		GPUs:               int32(len(n.GPUs)),
		Available:          c(gpuaas.PostureAvailable),
		PartiallyAllocated: c(gpuaas.PosturePartiallyAllocated),
		AllocatedWhole:     c(gpuaas.PostureAllocatedWhole),
		FullyAllocated:     c(gpuaas.PostureFullyAllocated),
		Allocated:          c(gpuaas.PostureAllocatedWhole) + c(gpuaas.PostureFullyAllocated),
		Draining:           c(gpuaas.PostureDraining),
		CleanupBlocked:     c(gpuaas.PostureCleanupBlocked),
		Unhealthy:          c(gpuaas.PostureUnhealthy),
		Faulty:             c(gpuaas.PostureUnhealthy) + c(gpuaas.PostureCleanupBlocked),
	}
}
