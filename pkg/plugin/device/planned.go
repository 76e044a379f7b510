package device

import (
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	resourceapi "k8s.io/api/resource/v1"
)

// Planned is one allocation result resolved to our device and its
// configuration.
type Planned struct {
	Result resourceapi.DeviceRequestAllocationResult
	Device *AllocatableDevice
	Config configapi.Interface
	// ClassCaps are the MPS limits the class's config (the admin's) sets
	// for the device: caps that the claim's config may only lower; nil
	// for none.
	ClassCaps *configapi.MpsConfig
	// Sharing are the GPU settings the device needs; nil for none.
	Sharing *sharingPlan
	// Rebuild marks a claim prepared before whose record could not be
	// read (damaged, or of a newer release's format after a rollback):
	// what that prepare made may still be there, in use by its container.
	Rebuild bool
}

// AdminAccess reports whether the device was allocated for monitoring.
func (p Planned) AdminAccess() bool {
	return p.Result.AdminAccess != nil && *p.Result.AdminAccess
}

// Exclusive reports whether the device may be held by this claim alone.
func (p Planned) Exclusive() bool {
	return !p.AdminAccess() && !p.Device.MultiAllocatable()
}
