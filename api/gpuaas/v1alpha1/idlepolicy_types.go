package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IdleAction is what the controller does to a claim idle past its policy.
// +kubebuilder:validation:Enum=None;Notify;Deactivate;Evict
type IdleAction string

const (
	// IdleActionNone measures and reports idleness but never acts: a
	// profile's policy with None exempts the profile's claims from the
	// tenant's policy.
	IdleActionNone IdleAction = "None"
	// IdleActionNotify raises an event on the claim and its pods, a
	// TenantQuota condition and a metric (and so an alert); nothing stops.
	IdleActionNotify IdleAction = "Notify"
	// IdleActionDeactivate sets spec.active=false on the Kueue Workload of
	// the claim's pods: Kueue evicts it and keeps it out of admission until
	// a person reactivates it. A pod without a Workload is notified.
	IdleActionDeactivate IdleAction = "Deactivate"
	// IdleActionEvict evicts the claim's pods through the Eviction API,
	// which honours their PodDisruptionBudgets.
	IdleActionEvict IdleAction = "Evict"
)

// IdlePolicy is how the service treats claims whose GPUs stay idle: the
// node's plugin judges each prepared device idle while the use it measures
// for the claim stays at or below ThresholdPercent in every sampling
// window, and reports when that began in the claim's device status; the
// controller acts once a claim has been idle for Duration and warned for
// Warning. A claim whose use is unknown (NVML cannot tell, or the plugin's
// samples stopped) is never acted on (docs/usage.md).
type IdlePolicy struct {
	// ThresholdPercent: a device is idle while its claim's processes use
	// at most this percentage of it (SM utilization as NVML reports it,
	// of the whole device the claim was given: a GPU, a MIG device or the
	// shared GPU). 0 means no use at all.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	ThresholdPercent int32 `json:"thresholdPercent,omitempty"`

	// Duration is how long a claim must stay idle before it is warned.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="duration must be at least 1m"
	Duration metav1.Duration `json:"duration"`

	// Warning is how long the warning event precedes the action; the
	// action is dropped if the claim is used again meanwhile. Default 0:
	// act at once.
	// +optional
	Warning *metav1.Duration `json:"warning,omitempty"`

	// Action is what happens to a claim idle past Duration and Warning.
	Action IdleAction `json:"action"`

	// ExemptNamespaceSelector exempts the namespaces whose labels match:
	// namespace labels are the cluster admin's to write, not the tenant's.
	// Labels, annotations and names of pods and claims are never
	// evidence of an exemption.
	// +optional
	ExemptNamespaceSelector *metav1.LabelSelector `json:"exemptNamespaceSelector,omitempty"`
}

// Device status condition the plugin writes for each prepared device of a
// claim (status.devices[].conditions), only when its state changes.
const (
	// DeviceConditionIdle: True, the claim has been idle on this device
	// since lastTransitionTime (reason BelowThreshold, the message the
	// threshold and the use measured); False, it is in use (reason
	// InUse); Unknown, NVML cannot tell or no sample is recent (reasons
	// UseUnknown, NoSamples).
	DeviceConditionIdle = "Idle"

	ReasonIdleBelowThreshold = "BelowThreshold"
	ReasonIdleInUse          = "InUse"
	ReasonIdleUseUnknown     = "UseUnknown"
	ReasonIdleNoSamples      = "NoSamples"
)

// UseLeasePrefix names the Lease each node's plugin renews in its own
// namespace while it samples use: "<prefix><node name>". The controller acts
// on a device's Idle condition only while that Lease is fresh and was
// acquired before the condition's lastTransitionTime (a restarted plugin
// has not yet seen the idleness it reports).
const UseLeasePrefix = "gpuaas-use-"

// TenantQuota status condition the controller's idle policy writes: True
// while some of the tenant's claims are idle past their policy's Duration
// (the message counts them and names the first few), False when none is.
const (
	ConditionIdleClaims = "IdleClaims"

	ReasonIdlePastPolicy = "IdlePastPolicy"
	ReasonNoIdleClaims   = "NoIdleClaims"
)
