package timeslice

import (
	"fmt"
	"maps"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// Device types published for shared GPUs.
const (
	TypeTimeSlice = "timeslice"
	TypeShared    = "shared"
)

// Parent is the GPU replicas and shares live on, with the attributes every
// device on it carries.
type Parent struct {
	Index       int
	UUID        string
	MemoryBytes uint64
	Attributes  map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// ReplicaName is the stable name of replica r of a GPU.
func ReplicaName(index, r int) string { return fmt.Sprintf("gpu-%d-ts-%d", index, r) }

// SharedName is the stable name of a shared GPU's one device.
func SharedName(index int) string { return fmt.Sprintf("gpu-%d-shared", index) }

// ReplicaMemory is each replica's share of the GPU's memory, rounded down
// so that N replicas never add up to more than the GPU has.
func ReplicaMemory(total uint64, replicas int) uint64 { return total / uint64(replicas) }

// ReplicaShare is each replica's share of an amount of the GPU (its GPU
// milliunits), rounded down like ReplicaMemory: N replicas never add up to
// more than the GPU, so a counter of the amount never refuses the last one.
func ReplicaShare(total int64, replicas int) int64 {
	if replicas < 1 {
		return 0
	}
	return total / int64(replicas)
}

// ReplicaDevices describes the N replicas of a time-sliced GPU: the
// parent's attributes plus type, replicas and parentUUID, and memory/N.
// Each consumes its own copy of consumes (its share of its GPU's counter
// sets, for Kueue's quota; nil for none).
func ReplicaDevices(p Parent, mode configapi.TimeSlicingMode, consumes []resourceapi.DeviceCounterConsumption) []resourceapi.Device {
	mem := resource.NewQuantity(int64(ReplicaMemory(p.MemoryBytes, mode.Replicas)), resource.BinarySI)
	out := make([]resourceapi.Device, 0, mode.Replicas)
	for r := range mode.Replicas {
		attrs := childAttributes(p, TypeTimeSlice, GPUSettings(mode.Strategy, mode.Interval))
		attrs["replicas"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(mode.Replicas))}
		out = append(out, resourceapi.Device{
			Name:             ReplicaName(p.Index, r),
			Attributes:       attrs,
			Capacity:         map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: *mem}},
			ConsumesCounters: copyConsumption(consumes),
		})
	}
	return out
}

func copyConsumption(in []resourceapi.DeviceCounterConsumption) []resourceapi.DeviceCounterConsumption {
	if in == nil {
		return nil
	}
	out := make([]resourceapi.DeviceCounterConsumption, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}

// SharedDevice describes a shared GPU: one device that many claims may hold
// (allowMultipleAllocations), each consuming memory within the policy, so
// the scheduler never hands out more memory than the GPU has.
func SharedDevice(p Parent, mode configapi.SharedMode) resourceapi.Device {
	minimum, step, def := mode.Memory.Resolved()
	total := resource.NewQuantity(int64(p.MemoryBytes), resource.BinarySI)
	var largest *resource.Quantity // one claim's largest share; nil: the GPU
	if mode.Memory.Max != nil {
		largest = ptr.To(mode.Memory.Max.DeepCopy())
	}
	return resourceapi.Device{
		Name:                     SharedName(p.Index),
		Attributes:               childAttributes(p, TypeShared, GPUSettings(mode.Strategy, "")),
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {
			Value: *total,
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:    &def,
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &minimum, Step: &step, Max: largest},
			},
		}},
	}
}

// ValidateShared checks the policy against the GPU it is applied to: the
// API server would reject the whole slice otherwise.
func ValidateShared(p Parent, mode configapi.SharedMode) error {
	minimum, step, def := mode.Memory.Resolved()
	total := int64(p.MemoryBytes)
	if minimum.Value()+step.Value() > total || def.Value() > total || (mode.Memory.Max != nil && mode.Memory.Max.Value() > total) {
		return fmt.Errorf("shared.memory: min %s + step %s, default %s and max must fit in the GPU's %s",
			minimum.String(), step.String(), def.String(), resource.NewQuantity(total, resource.BinarySI).String())
	}
	return nil
}

// Attributes that publish a shared GPU's settings, so that claims select
// the GPUs whose settings they need.
const (
	AttrSharingStrategy   = "sharingStrategy"
	AttrTimeSliceInterval = "timeSliceInterval"
)

func childAttributes(p Parent, typ string, set Settings) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := maps.Clone(p.Attributes)
	attrs["type"] = resourceapi.DeviceAttribute{StringValue: ptr.To(typ)}
	attrs["parentUUID"] = resourceapi.DeviceAttribute{StringValue: ptr.To(p.UUID)}
	attrs[AttrSharingStrategy] = resourceapi.DeviceAttribute{StringValue: ptr.To(string(set.Strategy))}
	if set.Strategy == configapi.TimeSlicingStrategy {
		attrs[AttrTimeSliceInterval] = resourceapi.DeviceAttribute{StringValue: ptr.To(string(set.Interval))}
	}
	return attrs
}
