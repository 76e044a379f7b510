package plugin

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

// replicaOf is the kind of each replica of a GPU time-sliced in mode.
func replicaOf(mode configapi.TimeSlicingMode) timeSliceReplica {
	return timeSliceReplica{replicas: mode.Replicas, settings: timeslice.GPUSettings(mode.Strategy, mode.Interval)}
}

func (timeSliceReplica) Type() DeviceType { return TypeTimeSlice }

func (k timeSliceReplica) modeName() string {
	return fmt.Sprintf("%s/%d", modeTimeSlicing, k.replicas) + settingsSuffix(k.settings)
}

func (k timeSliceReplica) planSharing(p plannedDevice) (*sharingPlan, error) {
	return planGPUSharing(p, k.settings, int64(timeslice.ReplicaMemory(p.device.GPU.MemoryBytes, k.replicas)))
}
