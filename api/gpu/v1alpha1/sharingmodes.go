package v1alpha1

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
)

// MaxReplicas bounds time-slice replicas: every replica is a device, and a
// ResourceSlice holds at most 64 devices.
const MaxReplicas = 64

// TimeSlicingMode offers a GPU as Replicas devices that take turns on it.
type TimeSlicingMode struct {
	// Replicas is the number of devices, 1..64; each has memory/Replicas.
	Replicas int `json:"replicas"`
	// Interval is applied while a replica is prepared; empty means
	// Default. Not with Strategy MPS.
	Interval TimeSliceInterval `json:"interval,omitempty"`
	// Strategy is how the claims on the GPU share it: TimeSlicing (the
	// default) or MPS. It is the GPU's, published as the sharingStrategy
	// attribute: claims select it; their config cannot change it.
	Strategy SharingStrategy `json:"strategy,omitempty"`
}

// SharedMode offers a GPU as one device that many claims hold at once
// (KEP-5075), each consuming part of its memory capacity.
type SharedMode struct {
	// Memory is the request policy of the memory capacity.
	Memory SharedMemoryPolicy `json:"memory,omitempty"`
	// Strategy is how the claims on the GPU share it: TimeSlicing (the
	// default) or MPS. It is the GPU's, published as the sharingStrategy
	// attribute: claims select it; their config cannot change it.
	Strategy SharingStrategy `json:"strategy,omitempty"`
}

// The sharing settings of a time-sliced or shared GPU (strategy and
// interval) are the GPU's, set by the node configuration and published as
// the devices' sharingStrategy and timeSliceInterval attributes, never a
// claim's: a GPU runs an MPS daemon or not, and has one time-slice
// interval, so claims asking for different settings on one GPU could never
// all be prepared. Claims select the settings they need by attribute (the
// scheduler then only picks compatible GPUs); a claim's config may restate
// the GPU's settings and set its own MPS limits, but not change them.

// validateGPUStrategy checks a sharing mode's strategy and interval.
func validateGPUStrategy(field string, s SharingStrategy, interval TimeSliceInterval) error {
	switch s {
	case "", TimeSlicingStrategy:
		return nil
	case MPSStrategy:
		if interval.OrDefault() != DefaultTimeSlice {
			return fmt.Errorf("%s.interval: %s does not apply with strategy MPS (MPS clients run concurrently)", field, interval)
		}
		return nil
	}
	return fmt.Errorf("%s.strategy: %q is not %s or %s", field, s, TimeSlicingStrategy, MPSStrategy)
}

// SharedMemoryPolicy bounds what one claim may take of a shared GPU's memory.
// Unset values default to 1Gi.
type SharedMemoryPolicy struct {
	// Min is the smallest share.
	Min *resource.Quantity `json:"min,omitempty"`
	// Step is the granularity of shares; requests are rounded up to it.
	Step *resource.Quantity `json:"step,omitempty"`
	// Default is what a claim that names no memory gets; a multiple of Step.
	Default *resource.Quantity `json:"default,omitempty"`
	// Max is the largest share one claim may take; unset: the whole GPU.
	// On an MPS GPU it is also what the GPU's daemon allows a client that
	// drops its CUDA_MPS_* environment (the daemon's defaults).
	Max *resource.Quantity `json:"max,omitempty"`
}

var oneGi = resource.MustParse("1Gi")

// Resolved returns min, step and default with the defaults filled in.
func (p SharedMemoryPolicy) Resolved() (minimum, step, def resource.Quantity) {
	minimum, step = orOneGi(p.Min), orOneGi(p.Step)
	def = minimum
	if p.Default != nil {
		def = p.Default.DeepCopy()
	}
	return minimum, step, def
}

func orOneGi(q *resource.Quantity) resource.Quantity {
	if q == nil {
		return oneGi.DeepCopy()
	}
	return q.DeepCopy()
}

func (m *TimeSlicingMode) validate() error {
	if m.Replicas < 1 || m.Replicas > MaxReplicas {
		return fmt.Errorf("timeSlicing.replicas: %d is out of range 1..%d", m.Replicas, MaxReplicas)
	}
	if err := m.Interval.Validate(); err != nil {
		return fmt.Errorf("timeSlicing.%w", err)
	}
	return validateGPUStrategy("timeSlicing", m.Strategy, m.Interval)
}

// validate checks what the API server would otherwise reject in the
// published slice, so a bad file stops the plugin with the reason.
func (m *SharedMode) validate() error {
	minimum, step, def := m.Memory.Resolved()
	if minimum.Sign() <= 0 || step.Sign() <= 0 {
		return errors.New("shared.memory: min and step must be positive")
	}
	if def.Cmp(minimum) < 0 {
		return fmt.Errorf("shared.memory.default: %s is below min %s", def.String(), minimum.String())
	}
	if def.Value()%step.Value() != 0 {
		return fmt.Errorf("shared.memory.default: %s is not a multiple of step %s", def.String(), step.String())
	}
	if hi := m.Memory.Max; hi != nil && (hi.Cmp(def) < 0 || (hi.Value()-minimum.Value())%step.Value() != 0) {
		return fmt.Errorf("shared.memory.max: %s must be at least default %s and min %s plus a multiple of step %s",
			hi.String(), def.String(), minimum.String(), step.String())
	}
	return validateGPUStrategy("shared", m.Strategy, "")
}

// validateSharing checks the sharing modes and that at most one mode is set.
func (m GpuMode) validateSharing() error {
	set := 0
	for _, on := range []bool{m.MIG != "", m.TimeSlicing != nil, m.Shared != nil} {
		if on {
			set++
		}
	}
	if set > 1 {
		return errors.New("mig, timeSlicing and shared are exclusive: a GPU is offered in one mode")
	}
	if m.TimeSlicing != nil {
		return m.TimeSlicing.validate()
	}
	if m.Shared != nil {
		return m.Shared.validate()
	}
	return nil
}

// deepCopy copies the mode's pointers.
func (m GpuMode) deepCopy() GpuMode {
	m.MigProfiles = slices.Clone(m.MigProfiles)
	if m.TimeSlicing != nil {
		ts := *m.TimeSlicing
		m.TimeSlicing = &ts
	}
	if m.Shared != nil {
		sh := SharedMode{Memory: SharedMemoryPolicy{}, Strategy: m.Shared.Strategy}
		sh.Memory.Min = copyQuantity(m.Shared.Memory.Min)
		sh.Memory.Step = copyQuantity(m.Shared.Memory.Step)
		sh.Memory.Default = copyQuantity(m.Shared.Memory.Default)
		sh.Memory.Max = copyQuantity(m.Shared.Memory.Max)
		m.Shared = &sh
	}
	return m
}

func copyQuantity(q *resource.Quantity) *resource.Quantity {
	if q == nil {
		return nil
	}
	c := q.DeepCopy()
	return &c
}
