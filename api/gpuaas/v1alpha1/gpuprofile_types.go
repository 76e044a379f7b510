package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeviceType is the value of the "type" attribute the kubelet plugin
// publishes on every device.
// +kubebuilder:validation:Enum=gpu;mig;timeslice;shared
type DeviceType string

// Device types published by the kubelet plugin.
const (
	DeviceTypeGPU       DeviceType = "gpu"
	DeviceTypeMIG       DeviceType = "mig"
	DeviceTypeTimeSlice DeviceType = "timeslice"
	DeviceTypeShared    DeviceType = "shared"
)

// GpuProfile is one entry of the GPU service catalog ("Small MIG slice
// 1g.10gb", "Shared GPU, 4-way"). The dra-controller renders it into a
// DeviceClass of the same name and reports how many devices match.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=gpup,categories=gpuaas
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Display Name",type=string,JSONPath=`.spec.displayName`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.selector.type`
// +kubebuilder:printcolumn:name="Enabled",type=boolean,JSONPath=`.spec.enabled`
// +kubebuilder:printcolumn:name="Matching",type=integer,JSONPath=`.status.matchingDevices`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.allocatedDevices`
// +kubebuilder:printcolumn:name="Free",type=integer,JSONPath=`.status.freeDevices`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GpuProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GpuProfileSpec   `json:"spec"`
	Status GpuProfileStatus `json:"status,omitempty"`
}

// GpuProfileSpec is what an administrator writes.
type GpuProfileSpec struct {
	// DisplayName is the human-readable name of the catalog entry.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	DisplayName string `json:"displayName,omitempty"`

	// Description says what the entry is for.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Description string `json:"description,omitempty"`

	// Selector says which published devices belong to this profile. All
	// set fields must match; an empty selector matches every device of the
	// driver.
	// +optional
	Selector ProfileSelector `json:"selector,omitempty"`

	// Config is opaque configuration for driver gpu.gpuaas.io attached to
	// the DeviceClass (apiVersion gpu.gpuaas.io/v1alpha1, kind GpuConfig or
	// MigConfig). It is decoded strictly: unknown fields are errors.
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	// +optional
	Config *runtime.RawExtension `json:"config,omitempty"`

	// ExtendedResourceName, when set, lets pods ask for devices of this
	// profile through resources.requests (e.g. gpuaas.io/shared-gpu: 1).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ExtendedResourceName *string `json:"extendedResourceName,omitempty"`

	// KueueResource is the Kueue resource this profile's devices are
	// charged as, in thousandths of a GPU unit read from the
	// gpu-milliunits counter each device consumes (docs/kueue.md); e.g.
	// one resource per GPU model. Default gpu.gpuaas.io/gpu-milliunits.
	// With --kueue the controller lists the profile's DeviceClass under it
	// in the deviceClassMappings it renders for Kueue's configuration.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	KueueResource *string `json:"kueueResource,omitempty"`

	// Enabled profiles have a DeviceClass. Disabling a profile removes its
	// DeviceClass once no ResourceClaim uses it any more.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// HardwareProfile is what the profile's OpenShift AI HardwareProfile
	// says beyond the profile itself (docs/platform.md, "OpenShift AI"):
	// the controller publishes one per profile in
	// --hardware-profile-namespace and, with
	// --hardware-profiles-per-tenant, in each tenant's namespaces, where
	// the HardwareProfile CRD is served. Unset fields take the documented
	// defaults.
	// +optional
	HardwareProfile *HardwareProfileSettings `json:"hardwareProfile,omitempty"`

	// Price is what the devices cost while allocated (docs/platform.md,
	// "Billing"); unpriced devices are billed at zero, their unit-seconds
	// still recorded. A change applies from the moment the controller sees it.
	// +optional
	Price *Price `json:"price,omitempty"`

	// IdlePolicy overrides the tenants' idle policies for this profile's
	// devices (action None exempts them, e.g. an inference profile).
	// +optional
	IdlePolicy *IdlePolicy `json:"idlePolicy,omitempty"`
}

// HardwareProfileSettings are the parts of an OpenShift AI HardwareProfile
// the GpuProfile cannot say by itself: the CPU and memory a workload picking
// it gets (the dashboard hides a profile without both), how many devices
// it may ask, and the Kueue LocalQueue it is scheduled through.
type HardwareProfileSettings struct {
	// DisplayName overrides the profile's displayName in the dashboard.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	DisplayName string `json:"displayName,omitempty"`

	// Description overrides the profile's description in the dashboard.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Description string `json:"description,omitempty"`

	// CPU is the CPU identifier's range, in cores; default 1 to 8, 2 by
	// default.
	// +optional
	CPU *ResourceRange `json:"cpu,omitempty"`

	// Memory is the memory identifier's range; default 2Gi to 64Gi, 8Gi
	// by default.
	// +optional
	Memory *ResourceRange `json:"memory,omitempty"`

	// MaxDevices is the most devices of this profile a workload may ask
	// through the profile's extendedResourceName (the Accelerator
	// identifier's maxCount); default 1.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxDevices *int32 `json:"maxDevices,omitempty"`

	// LocalQueueName, when set, makes the HardwareProfile's scheduling
	// type Queue with this Kueue LocalQueue (the dashboard offers it in
	// the projects where a LocalQueue of that name exists); unset: type
	// Node. In a tenant's namespace (--hardware-profiles-per-tenant) the
	// scheduling is the tenant's instead: Queue with a LocalQueue of the
	// tenant's Kueue ClusterQueue (spec.kueue; this one preferred where
	// several point at it) for a Kueue-managed tenant, Node otherwise.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	LocalQueueName string `json:"localQueueName,omitempty"`

	// PriorityClass is the Kueue WorkloadPriorityClass of the workloads
	// started with the HardwareProfile; only with localQueueName, or in
	// a Kueue-managed tenant's namespace.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClass string `json:"priorityClass,omitempty"`
}

// ResourceRange is an identifier's least, default and most amount; unset
// fields take the identifier's defaults.
type ResourceRange struct {
	// Min is the least a workload may ask.
	// +optional
	Min *resource.Quantity `json:"min,omitempty"`
	// Default is what a workload gets unless its user asks otherwise.
	// +optional
	Default *resource.Quantity `json:"default,omitempty"`
	// Max is the most a workload may ask.
	// +optional
	Max *resource.Quantity `json:"max,omitempty"`
}

// ProfileSelector selects devices by the attributes the plugin publishes.
// +kubebuilder:validation:XValidation:rule="!has(self.migProfile) || !has(self.type) || self.type == 'mig'",message="migProfile requires type mig"
type ProfileSelector struct {
	// Type of device: gpu (whole GPU), mig (MIG partition), timeslice
	// (time-slice replica) or shared (memory share of a GPU).
	// +optional
	Type DeviceType `json:"type,omitempty"`

	// ProductName must equal the device's productName attribute, e.g.
	// "NVIDIA H100 80GB HBM3".
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ProductName string `json:"productName,omitempty"`

	// Architecture must equal the device's architecture attribute, e.g.
	// "Hopper".
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Architecture string `json:"architecture,omitempty"`

	// MinMemory is the least memory capacity a device must have.
	// +optional
	MinMemory *resource.Quantity `json:"minMemory,omitempty"`

	// MigProfile is a MIG profile name such as 1g.10gb or 3g.40gb; it
	// implies type mig.
	// +kubebuilder:validation:Pattern=`^([1-7]c\.)?[1-8]g\.[0-9]+gb(\+me|\+me\.all|\+gfx|-me)?$`
	// +optional
	MigProfile string `json:"migProfile,omitempty"`

	// CEL is an additional DRA CEL selector expression over "device", as
	// in DeviceClass.spec.selectors[].cel.expression.
	// +kubebuilder:validation:MaxLength=10240
	// +optional
	CEL string `json:"cel,omitempty"`
}

// GpuProfileStatus is what the dra-controller observed.
type GpuProfileStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// DeviceClassName is the DeviceClass rendered from this profile.
	// +optional
	DeviceClassName string `json:"deviceClassName,omitempty"`

	// MatchingDevices is how many published devices the profile selects.
	// +optional
	MatchingDevices int32 `json:"matchingDevices"`

	// AllocatedDevices is how many of them are allocated to a claim.
	// +optional
	AllocatedDevices int32 `json:"allocatedDevices"`

	// FreeDevices is MatchingDevices minus AllocatedDevices.
	// +optional
	FreeDevices int32 `json:"freeDevices"`

	// HardwareProfileNamespaces are the namespaces holding the profile's
	// OpenShift AI HardwareProfile (docs/platform.md, "OpenShift AI"); the
	// HardwareProfilesPublished condition says where it is not, and why.
	// +listType=set
	// +optional
	HardwareProfileNamespaces []string `json:"hardwareProfileNamespaces,omitempty"`

	// Conditions: Ready says whether the DeviceClass is in sync with the
	// spec; its reason and message explain why not.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// IsEnabled reports whether the profile should have a DeviceClass (unset
// means enabled).
func (p *GpuProfile) IsEnabled() bool {
	return p.Spec.Enabled == nil || *p.Spec.Enabled
}

// GpuProfileList is a list of GpuProfiles.
// +kubebuilder:object:root=true
type GpuProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GpuProfile `json:"items"`
}
