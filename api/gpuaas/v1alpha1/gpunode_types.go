package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Posture says what a GPU (or a node) can do for new work and why, as an
// operator reads it. The GPU postures, first that holds wins:
//
//	Unhealthy           a device of the GPU carries one of the plugin's fault
//	                    taints (gpu.gpuaas.io/xid, ecc, gpu-lost, ...) with an
//	                    effect other than None
//	CleanupBlocked      a device carries gpu.gpuaas.io/cleanup-blocked: a MIG
//	                    teardown failed and the GPU needs an admin
//	Draining            an admin's DeviceTaintRule, or a taint not set by the
//	                    plugin, with effect NoSchedule or NoExecute covers a
//	                    device of the GPU
//	AllocatedWhole      the whole-GPU device is allocated
//	FullyAllocated      something is allocated and nothing more can be: every
//	                    replica, every remaining MIG partition overlaps an
//	                    allocated one, or no further share fits
//	PartiallyAllocated  something is allocated and more can be
//	Available           nothing is allocated
//
// Nodes add Empty (the driver publishes no GPU there), Degraded (some GPU
// is Unhealthy, CleanupBlocked or Draining while others still take work)
// and ExclusivelyAllocated (every GPU is in service, full and held by one
// claim alone through a request with allocationMode All: a whole-node
// lease, as opposed to a node filled up by several claims).
// +kubebuilder:validation:Enum=Unhealthy;CleanupBlocked;Draining;AllocatedWhole;FullyAllocated;PartiallyAllocated;Available;Degraded;Empty;ExclusivelyAllocated
type Posture string

// Postures, in the priority order of a GPU's (see Posture).
const (
	PostureUnhealthy          Posture = "Unhealthy"
	PostureCleanupBlocked     Posture = "CleanupBlocked"
	PostureDraining           Posture = "Draining"
	PostureAllocatedWhole     Posture = "AllocatedWhole"
	PostureFullyAllocated     Posture = "FullyAllocated"
	PosturePartiallyAllocated Posture = "PartiallyAllocated"
	PostureAvailable          Posture = "Available"
	// PostureDegraded (nodes only): some GPUs are out of service, others
	// still take work.
	PostureDegraded Posture = "Degraded"
	// PostureEmpty (nodes only): the driver runs on the node but publishes
	// no GPU.
	PostureEmpty Posture = "Empty"
	// PostureExclusivelyAllocated (nodes only): every GPU is in service,
	// full and held by one claim alone through a request with
	// allocationMode All (a whole-node lease).
	PostureExclusivelyAllocated Posture = "ExclusivelyAllocated"
)

// GpuPostures are the postures a GPU can have, in priority order.
var GpuPostures = []Posture{
	PostureUnhealthy, PostureCleanupBlocked, PostureDraining, PostureAllocatedWhole,
	PostureFullyAllocated, PosturePartiallyAllocated, PostureAvailable,
}

// GpuNode reports, for one node (same name), the posture of each of its
// GPUs as published by driver gpu.gpuaas.io: available, partially or fully
// allocated, allocated whole, draining, cleanup-blocked or unhealthy, each
// with the reason. The dra-controller creates it when the node publishes
// devices and deletes it when the node publishes none; it has no spec.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=gpun,categories=gpuaas
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Node-Posture",type=string,JSONPath=`.status.posture`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.summary.gpus`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.summary.available`
// +kubebuilder:printcolumn:name="Partial",type=integer,JSONPath=`.status.summary.partiallyAllocated`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.summary.allocated`
// +kubebuilder:printcolumn:name="Draining",type=integer,JSONPath=`.status.summary.draining`
// +kubebuilder:printcolumn:name="Unhealthy",type=integer,JSONPath=`.status.summary.faulty`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GpuNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status GpuNodeStatus `json:"status,omitempty"`
}

// GpuNodeStatus is what the dra-controller observed of the node's devices,
// their allocations and taints.
type GpuNodeStatus struct {
	// Posture of the node as a whole: the GPUs' posture when they all
	// share one; otherwise Unhealthy, CleanupBlocked or Draining (first
	// that any GPU has) when no GPU takes work, FullyAllocated when every
	// GPU is full or out of service, Degraded when some are out of service,
	// PartiallyAllocated when something is allocated, else Available.
	// Empty when the node publishes no GPU. ExclusivelyAllocated, before
	// all but the out-of-service postures, when every GPU is full and held
	// by one claim alone through a request with allocationMode All (a
	// whole-node lease).
	// +optional
	Posture Posture `json:"posture,omitempty"`

	// Reason says why, in words: the counts per posture and the reasons of
	// GPUs out of service.
	// +optional
	Reason string `json:"reason,omitempty"`

	// Summary counts the GPUs per posture.
	// +optional
	Summary PostureSummary `json:"summary"`

	// GPUs are the node's GPUs by NVML index.
	// +optional
	GPUs []GpuPosture `json:"gpus,omitempty"`

	// ClusterVersion is the API server version whose features the
	// controller last probed (dry-run creates of ResourceSlices, as the
	// plugin probes before it publishes); empty until it could ask.
	// +optional
	ClusterVersion string `json:"clusterVersion,omitempty"`

	// MissingFeatures are the DRA features this cluster's API server drops
	// or refuses, each with the feature gate that brings it and what the
	// node offers without it. The same for every node of the cluster.
	// +optional
	// +listType=atomic
	MissingFeatures []MissingFeature `json:"missingFeatures,omitempty"`

	// ObservedTime is when the controller last found the status changed;
	// a status that stays the same is not rewritten.
	// +optional
	ObservedTime *metav1.Time `json:"observedTime,omitempty"`
}

// MissingFeature is a DRA feature the cluster lacks (docs/install.md, "What
// each Kubernetes version keeps").
type MissingFeature struct {
	// Feature as the docs name it, e.g. "partitionable devices".
	Feature string `json:"feature"`
	// Gate is the Kubernetes feature gate that brings it.
	Gate string `json:"gate"`
	// Effect is what the node offers instead.
	Effect string `json:"effect"`
}

// PostureSummary counts a node's GPUs per posture.
type PostureSummary struct {
	// GPUs is how many GPUs the node publishes.
	GPUs int32 `json:"gpus"`
	// Available GPUs have nothing allocated.
	Available int32 `json:"available"`
	// PartiallyAllocated GPUs have something allocated and room for more.
	PartiallyAllocated int32 `json:"partiallyAllocated"`
	// AllocatedWhole GPUs are allocated as a whole GPU.
	AllocatedWhole int32 `json:"allocatedWhole"`
	// FullyAllocated GPUs are full of MIG partitions, replicas or shares.
	FullyAllocated int32 `json:"fullyAllocated"`
	// Allocated is AllocatedWhole + FullyAllocated: GPUs with no room.
	Allocated int32 `json:"allocated"`
	// Draining GPUs are tainted by an admin.
	Draining int32 `json:"draining"`
	// CleanupBlocked GPUs wait for an admin after a failed teardown.
	CleanupBlocked int32 `json:"cleanupBlocked"`
	// Unhealthy GPUs carry a fault taint.
	Unhealthy int32 `json:"unhealthy"`
	// Faulty is Unhealthy + CleanupBlocked: GPUs that need an admin.
	Faulty int32 `json:"faulty"`
}

// GpuMode is how a GPU is offered, as its published devices show.
// +kubebuilder:validation:Enum=whole;mig-static;mig-dynamic;time-sliced;shared
type GpuMode string

// GPU modes.
const (
	GpuModeWhole      GpuMode = "whole"
	GpuModeMigStatic  GpuMode = "mig-static"
	GpuModeMigDynamic GpuMode = "mig-dynamic"
	GpuModeTimeSliced GpuMode = "time-sliced"
	GpuModeShared     GpuMode = "shared"
)

// GpuPosture is one GPU's posture.
type GpuPosture struct {
	// Index is the GPU's NVML index (the index attribute of its devices);
	// -1 when its devices carry none.
	Index int32 `json:"index"`
	// UUID of the GPU.
	// +optional
	UUID string `json:"uuid,omitempty"`
	// ProductName, e.g. "NVIDIA H100 80GB HBM3".
	// +optional
	ProductName string `json:"productName,omitempty"`
	// Mode is how the GPU is offered.
	// +optional
	Mode GpuMode `json:"mode,omitempty"`
	// Posture of the GPU (see the type's table).
	Posture Posture `json:"posture"`
	// Reason says why, e.g. "3 of 4 replicas allocated".
	// +optional
	Reason string `json:"reason,omitempty"`
	// Devices is how many devices the GPU is published as.
	Devices int32 `json:"devices"`
	// AllocatedDevices are the names of its allocated devices.
	// +optional
	AllocatedDevices []string `json:"allocatedDevices,omitempty"`
	// Claims are the ResourceClaims (namespace/name) holding its devices.
	// +optional
	Claims []string `json:"claims,omitempty"`
	// MemoryLimit says, for a GPU offered as time-slice replicas or
	// memory shares, whether the driver holds each of their containers
	// to the device's memory (their memoryLimitEnforced attribute):
	// DriverEnforced (driver r615+, cgroup v2), or NotEnforced, where a
	// container can use the whole GPU's memory (and MPS devices, whose
	// daemon limits their memory). Empty for whole and MIG GPUs, whose
	// memory is one claim's or the hardware's.
	// +optional
	MemoryLimit MemoryLimit `json:"memoryLimit,omitempty"`
}

// MemoryLimit is whether a shared GPU's devices have their memory
// enforced by the driver.
// +kubebuilder:validation:Enum=DriverEnforced;NotEnforced
type MemoryLimit string

// Memory limits of a shared GPU.
const (
	MemoryLimitDriverEnforced MemoryLimit = "DriverEnforced"
	MemoryLimitNotEnforced    MemoryLimit = "NotEnforced"
)

// GpuNodeList is a list of GpuNodes.
// +kubebuilder:object:root=true
type GpuNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GpuNode `json:"items"`
}
