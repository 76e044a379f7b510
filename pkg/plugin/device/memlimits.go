package device

import configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"

// AttrMemoryLimitEnforced is the attribute of a time-slice replica and of
// a memory share that says whether the driver holds each container to the
// device's memory (NVIDIA's r615 and later, on cgroup v2, with NVIDIA's
// hooks on): false where a container could use the whole GPU's memory
// (only the tenants' good manners keep them to their size), and on MPS
// devices, whose daemon pins their memory instead.
const AttrMemoryLimitEnforced = "memoryLimitEnforced"

// DriverLimitsMemory reports whether the device's containers are given a
// driver memory limit where the node's driver enforces one: replicas and
// shares not shared through MPS (see sharingPlan.MemoryLimitBytes). A
// whole GPU is all its container's; a MIG device's memory is its own.
func (d *AllocatableDevice) DriverLimitsMemory() bool {
	switch k := d.Kind.(type) {
	case timeSliceReplica:
		return k.settings.Strategy != configapi.MPSStrategy
	case memoryShare:
		return k.settings.Strategy != configapi.MPSStrategy
	}
	return false
}

// SharesGPUMemory reports whether the device is a slice of its GPU's
// memory that other claims' devices share the GPU beside: a replica or a
// share. These carry AttrMemoryLimitEnforced.
func (d *AllocatableDevice) SharesGPUMemory() bool {
	t := d.Type()
	return t == TypeTimeSlice || t == TypeShared
}
