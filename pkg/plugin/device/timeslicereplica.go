package device

import (
	"fmt"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// timeSliceReplica is one of the N replicas of a time-sliced GPU: each
// holds its GPU's sharing settings (the node configuration's) while
// prepared, and stands for 1/N of its memory.
type timeSliceReplica struct {
	holdsSetting
	replicas int
	settings timeslice.Settings
}

// ReplicaOf is the kind of each replica of a GPU time-sliced in mode.
func ReplicaOf(mode configapi.TimeSlicingMode) Kind {
	return timeSliceReplica{replicas: mode.Replicas, settings: timeslice.GPUSettings(mode.Strategy, mode.Interval)}
}

func (timeSliceReplica) Type() DeviceType { return TypeTimeSlice }

func (k timeSliceReplica) ModeName() string {
	return fmt.Sprintf("%s/%d", modeTimeSlicing, k.replicas) + settingsSuffix(k.settings)
}

func (k timeSliceReplica) PlanSharing(p Planned) (*sharingPlan, error) {
	return planGPUSharing(p, k.settings, int64(timeslice.ReplicaMemory(p.Device.GPU.MemoryBytes, k.replicas)))
}

// GPUSettings are the sharing settings the node configuration gives the
// replica's GPU.
func (k timeSliceReplica) GPUSettings() timeslice.Settings { return k.settings }
