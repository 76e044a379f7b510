package plugin

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

// sharedGPU is the kind of a GPU shared in mode.
func sharedGPU(mode configapi.SharedMode) memoryShare {
	return memoryShare{settings: timeslice.GPUSettings(mode.Strategy, "")}
}

func (memoryShare) Type() DeviceType { return TypeShared }

func (k memoryShare) modeName() string { return modeShared + settingsSuffix(k.settings) }

func (k memoryShare) planSharing(p plannedDevice) (*sharingPlan, error) {
	return planGPUSharing(p, k.settings, shareMemory(p))
}

// shareMemory is the memory a claim's share stands for: what the scheduler
// recorded as consumed, else the device's default request.
func shareMemory(p plannedDevice) int64 {
	if q, ok := p.result.ConsumedCapacity["memory"]; ok {
		return q.Value()
	}
	if c, ok := p.device.API.Capacity["memory"]; ok && c.RequestPolicy != nil && c.RequestPolicy.Default != nil {
		return c.RequestPolicy.Default.Value()
	}
	return int64(p.device.GPU.MemoryBytes)
}
