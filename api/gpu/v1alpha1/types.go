package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// DriverName is the DRA driver name; opaque configuration is matched on it.
const DriverName = "gpu.gpuaas.io"

// GroupName is the API group of the opaque configuration types.
const GroupName = "gpu.gpuaas.io"

// Version is the only version served today.
const Version = "v1alpha1"

// SchemeGroupVersion is the group and version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// Kinds of opaque configuration.
const (
	GpuConfigKind = "GpuConfig"
	MigConfigKind = "MigConfig"
)

// SharingStrategy says how the containers that reference one allocated device
// share it.
type SharingStrategy string

const (
	// ExclusiveStrategy: the device is used as allocated, with no sharing
	// settings applied. It is the default.
	ExclusiveStrategy SharingStrategy = "Exclusive"
)

// Sharing holds the sharing strategy of a device and its settings.
type Sharing struct {
	// Strategy is one of the SharingStrategy constants.
	Strategy SharingStrategy `json:"strategy"`
	// TimeSlicingConfig is only allowed with the TimeSlicing strategy.
	TimeSlicingConfig *TimeSlicingConfig `json:"timeSlicingConfig,omitempty"`
	// MpsConfig is only allowed with the MPS strategy.
	MpsConfig *MpsConfig `json:"mpsConfig,omitempty"`
}

// GpuConfig configures whole GPUs, time-slice replicas and memory shares
// of a GPU.
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Sharing is optional; nil means Exclusive.
	Sharing *Sharing `json:"sharing,omitempty"`
}

// MigConfig configures MIG devices.
type MigConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Sharing is optional; nil means Exclusive.
	Sharing *Sharing `json:"sharing,omitempty"`
}

// Interface is what every opaque configuration kind implements: it can be
// validated and knows its effective sharing strategy.
type Interface interface {
	runtime.Object
	Validate() error
	SharingStrategy() SharingStrategy
}

// DefaultGpuConfig is applied to a GPU when neither class nor claim say
// anything: the lowest-priority configuration.
func DefaultGpuConfig() *GpuConfig {
	return &GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: GpuConfigKind},
		Sharing:  &Sharing{Strategy: ExclusiveStrategy},
	}
}
