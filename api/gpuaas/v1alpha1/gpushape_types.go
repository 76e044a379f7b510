package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GpuShape is a capacity shape the GPU service sells: a whole 8-GPU node,
// one GPU plus the NIC on its PCIe root, two GPUs on one NUMA node. The
// dra-controller renders it into a ResourceClaimTemplate of the same name
// in every namespace of the TenantQuotas it names, so a pod asks for it
// with resourceClaimTemplateName and nothing else, and reports how many
// more instances could be placed now.
//
// It is a kind of its own, not a field of GpuProfile: a profile is one
// DeviceClass selecting one kind of our devices, while a shape composes
// several requests (our profiles and other drivers' DeviceClasses) with a
// constraint between them. DRA has no class of several devices: a
// multi-request claim is the only thing that can say it, and a claim
// template is namespaced, so a shape renders to one template per entitled
// namespace rather than to one cluster-wide class; its entitlement
// (tenants) and availability policy (whenUnavailable) have no place in a
// profile either.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=gshape,categories=gpuaas
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Alignment",type=string,JSONPath=`.spec.alignment`
// +kubebuilder:printcolumn:name="When Unavailable",type=string,JSONPath=`.spec.whenUnavailable`
// +kubebuilder:printcolumn:name="Placeable",type=integer,JSONPath=`.status.placeable`
// +kubebuilder:printcolumn:name="Templates",type=integer,JSONPath=`.status.templates`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GpuShape struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GpuShapeSpec   `json:"spec"`
	Status GpuShapeStatus `json:"status,omitempty"`
}

// ShapeAlignment says which attribute every device of one instance of a
// shape must share.
// +kubebuilder:validation:Enum=PCIeRoot;NUMANode;None
type ShapeAlignment string

// Alignments of a shape.
const (
	// AlignPCIeRoot: every device on one PCIe root
	// (resource.kubernetes.io/pcieRoot).
	AlignPCIeRoot ShapeAlignment = "PCIeRoot"
	// AlignNUMANode: every device on one NUMA node
	// (resource.kubernetes.io/numaNode).
	AlignNUMANode ShapeAlignment = "NUMANode"
	// AlignNone: only the node is shared (DRA allocates one claim on one
	// node).
	AlignNone ShapeAlignment = "None"
)

// WhenUnavailable says what happens to a new claim of a shape none of
// which can be placed now.
// +kubebuilder:validation:Enum=Queue;Refuse
type WhenUnavailable string

// Policies of a shape with nothing placeable.
const (
	// Queue: the claim is admitted and waits for the scheduler, as any
	// claim in Kubernetes and Kueue does.
	Queue WhenUnavailable = "Queue"
	// Refuse: the claim webhook refuses it at once with a message that
	// says so ("unavailable: shape ... has 0 placeable (...)").
	Refuse WhenUnavailable = "Refuse"
)

// ShapeAllocationMode is how many devices of a request one instance takes.
// +kubebuilder:validation:Enum=ExactCount;All
type ShapeAllocationMode string

// Allocation modes of a shape's request.
const (
	// ShapeExactCount: count devices.
	ShapeExactCount ShapeAllocationMode = "ExactCount"
	// ShapeAll: every matching device of the node (a whole-node lease).
	ShapeAll ShapeAllocationMode = "All"
)

// GpuShapeSpec is what an administrator writes.
type GpuShapeSpec struct {
	// DisplayName is the human-readable name of the shape.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	DisplayName string `json:"displayName,omitempty"`

	// Description says what the shape is for.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Description string `json:"description,omitempty"`

	// Requests are the parts of one instance, each one request of the
	// rendered claim template.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	Requests []ShapeRequest `json:"requests"`

	// Alignment: the devices of one instance share a PCIe root
	// (PCIeRoot), a NUMA node (NUMANode), or only the node (None). It is
	// rendered as a matchAttribute constraint over every request.
	// +kubebuilder:default=None
	// +optional
	Alignment ShapeAlignment `json:"alignment,omitempty"`

	// Tenants are the TenantQuotas whose namespaces get the shape's
	// ResourceClaimTemplate.
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Tenants []string `json:"tenants,omitempty"`

	// Price is what the devices cost while allocated (docs/platform.md,
	// "Billing"); unpriced devices are billed at zero, their unit-seconds
	// still recorded. A change applies from the moment the controller sees it.
	// +optional
	Price *Price `json:"price,omitempty"`

	// HardwareProfile is what the shape's OpenShift AI HardwareProfiles
	// say beyond the shape itself: the CPU and memory identifiers, the
	// display name and description, the preferred LocalQueue and the
	// priority class (maxDevices does not apply: a shape is asked through
	// its template). Published per tenant namespace holding the template,
	// where the controller publishes HardwareProfiles (docs/platform.md,
	// "OpenShift AI").
	// +optional
	HardwareProfile *HardwareProfileSettings `json:"hardwareProfile,omitempty"`

	// WhenUnavailable: Queue (default) admits a claim of the shape when
	// none can be placed and lets it wait; Refuse has the claim webhook
	// refuse it at once.
	// +kubebuilder:default=Queue
	// +optional
	WhenUnavailable WhenUnavailable `json:"whenUnavailable,omitempty"`
}

// ShapeRequest is one part of a shape: devices of one of our GpuProfiles
// or of any DeviceClass (another driver's NICs).
// +kubebuilder:validation:XValidation:rule="has(self.profile) != has(self.deviceClassName)",message="set exactly one of profile and deviceClassName"
// +kubebuilder:validation:XValidation:rule="!has(self.allocationMode) || self.allocationMode != 'All' || !has(self.count)",message="count is not allowed with allocationMode All"
type ShapeRequest struct {
	// Name of the request in the rendered claim (what a container's
	// resources.claims[].request names).
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Profile is a GpuProfile; the request names its DeviceClass.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Profile string `json:"profile,omitempty"`

	// DeviceClassName is any DeviceClass, e.g. another driver's NICs.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	DeviceClassName string `json:"deviceClassName,omitempty"`

	// AllocationMode: ExactCount (default) takes count devices; All takes
	// every matching device of the node.
	// +kubebuilder:default=ExactCount
	// +optional
	AllocationMode ShapeAllocationMode `json:"allocationMode,omitempty"`

	// Count of devices with ExactCount; default 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Count *int64 `json:"count,omitempty"`
}

// ClassName is the DeviceClass the request names.
func (r *ShapeRequest) ClassName() string {
	if r.Profile != "" {
		return r.Profile // a GpuProfile's DeviceClass has its name
	}
	return r.DeviceClassName
}

// IsAll reports whether the request takes every matching device of a node.
func (r *ShapeRequest) IsAll() bool { return r.AllocationMode == ShapeAll }

// DeviceCount is how many devices an ExactCount request takes (1 unset).
func (r *ShapeRequest) DeviceCount() int64 {
	if r.Count == nil {
		return 1
	}
	return *r.Count
}

// GpuShapeStatus is what the dra-controller observed.
type GpuShapeStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Namespaces holding the shape's ResourceClaimTemplate.
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// Templates is how many namespaces hold the template (the length of
	// namespaces).
	// +optional
	Templates int32 `json:"templates"`

	// HardwareProfileNamespaces are the namespaces holding the shape's
	// OpenShift AI HardwareProfile, which names its template there
	// (docs/platform.md, "OpenShift AI"); the HardwareProfilesPublished
	// condition says where it is not, and why.
	// +listType=set
	// +optional
	HardwareProfileNamespaces []string `json:"hardwareProfileNamespaces,omitempty"`

	// Placeable is how many more disjoint instances of the shape fit now
	// on healthy, unallocated devices, alignment respected, as counted
	// from the ResourceSlices and allocations the scheduler sees.
	// +optional
	Placeable int32 `json:"placeable"`

	// PlaceableMessage says why, e.g. "0 of 3 nodes have a free GPU+NIC
	// on one PCIe root".
	// +optional
	PlaceableMessage string `json:"placeableMessage,omitempty"`

	// Conditions: Ready says whether the templates are in sync and every
	// part exists; its reason and message name a missing part.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// UnavailableAction is WhenUnavailable with its default.
func (s *GpuShape) UnavailableAction() WhenUnavailable {
	if s.Spec.WhenUnavailable == "" {
		return Queue
	}
	return s.Spec.WhenUnavailable
}

// Entitles reports whether the shape names TenantQuota tenant.
func (s *GpuShape) Entitles(tenant string) bool {
	for _, t := range s.Spec.Tenants {
		if t == tenant {
			return true
		}
	}
	return false
}

// GpuShapeList is a list of GpuShapes.
// +kubebuilder:object:root=true
type GpuShapeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GpuShape `json:"items"`
}
