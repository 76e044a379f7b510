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
	// Interval is applied while a replica is prepared, unless a claim's
	// TimeSlicingConfig says otherwise; empty means Default.
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// SharedMode offers a GPU as one device that many claims hold at once
// (KEP-5075), each consuming part of its memory capacity.
type SharedMode struct {
	// Memory is the request policy of the memory capacity.
	Memory SharedMemoryPolicy `json:"memory,omitempty"`
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
	return nil
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
	return nil
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
		sh := SharedMode{Memory: SharedMemoryPolicy{}}
		sh.Memory.Min = copyQuantity(m.Shared.Memory.Min)
		sh.Memory.Step = copyQuantity(m.Shared.Memory.Step)
		sh.Memory.Default = copyQuantity(m.Shared.Memory.Default)
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
