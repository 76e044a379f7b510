package device

import (
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// memoryShare is a shared GPU's multi-allocatable device: each claim holds
// a share of its memory and the GPU's sharing settings (the node
// configuration's).
type memoryShare struct {
	holdsSetting
	settings timeslice.Settings
}

// SharedGPU is the kind of a GPU shared in mode.
func SharedGPU(mode configapi.SharedMode) Kind {
	return memoryShare{settings: timeslice.GPUSettings(mode.Strategy, "")}
}

func (memoryShare) Type() DeviceType { return TypeShared }

func (k memoryShare) ModeName() string { return modeShared + settingsSuffix(k.settings) }

func (k memoryShare) PlanSharing(p Planned) (*sharingPlan, error) {
	return planGPUSharing(p, k.settings, shareMemory(p))
}

// shareMemory is the memory a claim's share stands for: what the scheduler
// recorded as consumed, else the device's default request.
func shareMemory(p Planned) int64 {
	if q, ok := p.Result.ConsumedCapacity["memory"]; ok {
		return q.Value()
	}
	if c, ok := p.Device.API.Capacity["memory"]; ok && c.RequestPolicy != nil && c.RequestPolicy.Default != nil {
		return c.RequestPolicy.Default.Value()
	}
	return int64(p.Device.GPU.MemoryBytes)
}

// GPUSettings are the sharing settings the node configuration gives the
// shared GPU.
func (k memoryShare) GPUSettings() timeslice.Settings { return k.settings }
