package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TenantQuota is one tenant of the GPU service: its namespaces and what its
// ResourceClaims may consume, in devices per profile, GPU units (whole GPU =
// 1, MIG = compute slices / the GPU's slices, time-slice replica = 1/N,
// memory share = its memory / the GPU's) and GPU memory. Tenants in one
// cohort may borrow each other's idle quota up to a borrowing limit.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=tq,categories=gpuaas
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cohort",type=string,JSONPath=`.spec.cohort`
// +kubebuilder:printcolumn:name="Units Used",type=string,JSONPath=`.status.used.gpuUnits`
// +kubebuilder:printcolumn:name="Units Reserved",type=string,JSONPath=`.status.reserved.gpuUnits`
// +kubebuilder:printcolumn:name="Units Limit",type=string,JSONPath=`.spec.limits.gpuUnits`
// +kubebuilder:printcolumn:name="Memory Used",type=string,JSONPath=`.status.used.gpuMemory`
// +kubebuilder:printcolumn:name="Memory Limit",type=string,JSONPath=`.spec.limits.gpuMemory`
// +kubebuilder:printcolumn:name="Claims",type=integer,JSONPath=`.status.claimsCounted`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TenantQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantQuotaSpec   `json:"spec"`
	Status TenantQuotaStatus `json:"status,omitempty"`
}

// TenantQuotaSpec is what an administrator writes.
// +kubebuilder:validation:XValidation:rule="(has(self.namespaces) && size(self.namespaces) > 0) || has(self.namespaceSelector)",message="set namespaces or namespaceSelector"
// +kubebuilder:validation:XValidation:rule="!has(self.borrowingLimit) || (has(self.cohort) && size(self.cohort) > 0)",message="borrowingLimit requires a cohort"
// +kubebuilder:validation:XValidation:rule="!has(self.kueue) || has(self.limits.gpuUnits)",message="kueue requires limits.gpuUnits"
type TenantQuotaSpec struct {
	// Namespaces belonging to the tenant.
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelector adds the namespaces whose labels match.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// Limits of the tenant. A limit that is not set is not enforced.
	// +optional
	Limits QuotaLimits `json:"limits,omitempty"`

	// Cohort groups tenants that may borrow each other's idle quota.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Cohort string `json:"cohort,omitempty"`

	// BorrowingLimit caps how far beyond its own limits the tenant may go
	// by borrowing idle quota of its cohort. Unset: up to what the cohort
	// has idle; zero: no borrowing.
	// +optional
	BorrowingLimit *BorrowingLimit `json:"borrowingLimit,omitempty"`

	// ReclaimStandaloneClaims lets a cohort lender reclaim the tenant's
	// borrowing claims that no pod's template made (created by hand or by
	// another controller) once they have stayed unallocated past the
	// controller's reclaimUnallocatedAfter. Such a claim is deleted for
	// good: nothing makes it again. Unset, only the claims the
	// kube-controller-manager made from a pod's template are reclaimed (it
	// makes them again), and a lender waits for the others.
	// +optional
	ReclaimStandaloneClaims bool `json:"reclaimStandaloneClaims,omitempty"`

	// Kueue, when set, has the controller (run with --kueue) keep a Kueue
	// ClusterQueue that mirrors this tenant, so the two quotas never
	// disagree: its namespaces, its cohort, and limits.gpuUnits (and
	// borrowingLimit.gpuUnits) in GPU milli-units (docs/kueue.md). Other
	// fields of the ClusterQueue (preemption, fair sharing) stay the
	// admin's.
	// +optional
	Kueue *TenantKueue `json:"kueue,omitempty"`

	// IdlePolicy acts on the tenant's claims whose GPUs stay idle
	// (docs/usage.md). A GpuProfile's idlePolicy overrides it for the
	// profile's devices. Unset: idleness is measured and reported, never
	// acted on.
	// +optional
	IdlePolicy *IdlePolicy `json:"idlePolicy,omitempty"`

	// Budget is what the tenant may spend per billing period (a UTC
	// month), with thresholds that raise conditions, events and alerts,
	// and an optional refusal of new claims at 100% (docs/platform.md,
	// "Budgets").
	// +optional
	Budget *Budget `json:"budget,omitempty"`

	// Billing says who, besides the cluster's admins, may read the
	// tenant's usage records (docs/platform.md, "Billing").
	// +optional
	Billing *TenantBilling `json:"billing,omitempty"`
}

// TenantKueue names the Kueue ClusterQueue kept for a tenant.
type TenantKueue struct {
	// ClusterQueue is the name of the ClusterQueue.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	ClusterQueue string `json:"clusterQueue"`
}

// QuotaLimits are the limits of a tenant.
type QuotaLimits struct {
	// Devices is the most devices the tenant may hold per GpuProfile
	// (that is, per DeviceClass name).
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k] >= 0)",message="device limits must not be negative"
	// +optional
	Devices map[string]int64 `json:"devices,omitempty"`

	// GpuUnits is the most GPU units the tenant may hold, e.g. "2.5".
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="gpuUnits must not be negative"
	// +optional
	GpuUnits *resource.Quantity `json:"gpuUnits,omitempty"`

	// GpuMemory is the most GPU memory the tenant may hold, e.g. "160Gi".
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="gpuMemory must not be negative"
	// +optional
	GpuMemory *resource.Quantity `json:"gpuMemory,omitempty"`

	// Shapes is the most instances of each GpuShape (by name) the tenant
	// may hold at once: claims in its namespaces whose spec is the shape's
	// template's, admitted or allocated. What makes a claim an instance
	// is its spec alone, never its labels, annotations or name, so a claim
	// written by hand to the template's spec is charged as one. A shape
	// limit is strict: it is never borrowed from the cohort, and a Kueue
	// overrule does not lift it. The instances' devices are charged in
	// devices, gpuUnits and gpuMemory as well, as their parts.
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k] >= 0)",message="shape limits must not be negative"
	// +optional
	Shapes map[string]int64 `json:"shapes,omitempty"`
}

// BorrowingLimit caps borrowing from the cohort.
type BorrowingLimit struct {
	// GpuUnits the tenant may borrow beyond limits.gpuUnits.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="borrowingLimit.gpuUnits must not be negative"
	// +optional
	GpuUnits *resource.Quantity `json:"gpuUnits,omitempty"`

	// GpuMemory the tenant may borrow beyond limits.gpuMemory.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="borrowingLimit.gpuMemory must not be negative"
	// +optional
	GpuMemory *resource.Quantity `json:"gpuMemory,omitempty"`
}

// QuotaUsage is an amount of the quota's resources. GPU units are rounded
// up to thousandths here; admission itself uses exact fractions.
type QuotaUsage struct {
	// +optional
	GpuUnits *resource.Quantity `json:"gpuUnits,omitempty"`
	// +optional
	GpuMemory *resource.Quantity `json:"gpuMemory,omitempty"`
	// Devices per GpuProfile (DeviceClass) name.
	// +optional
	Devices map[string]int64 `json:"devices,omitempty"`
	// Shapes is instances per GpuShape name: claims whose spec is the
	// shape's template's.
	// +optional
	Shapes map[string]int64 `json:"shapes,omitempty"`
}

// TenantQuotaStatus is what the dra-controller observed.
type TenantQuotaStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Namespaces the quota applies to (resolved from the list and the
	// selector, minus those another, older quota claims first).
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// Used is what allocated claims hold, trued up from their allocation.
	// +optional
	Used QuotaUsage `json:"used,omitempty"`

	// Reserved is what admitted but not yet allocated claims may take
	// (their worst case).
	// +optional
	Reserved QuotaUsage `json:"reserved,omitempty"`

	// Borrowed is how far Used+Reserved exceeds the limits, taken from
	// the cohort's idle quota.
	// +optional
	Borrowed QuotaUsage `json:"borrowed,omitempty"`

	// ClaimsCounted is how many ResourceClaims are charged to the tenant.
	// +optional
	ClaimsCounted int32 `json:"claimsCounted"`

	// Budget is the current period's spend against spec.budget, written
	// by the billing recorder.
	// +optional
	Budget *BudgetStatus `json:"budget,omitempty"`

	// Conditions: Ready (the quota is valid and enforced),
	// NamespaceConflict (another quota claims one of the namespaces),
	// OverQuota (usage is above a limit, e.g. after the limit was lowered),
	// IdleClaims, BudgetThresholdReached and BudgetExhausted.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TenantQuotaList is a list of TenantQuotas.
// +kubebuilder:object:root=true
type TenantQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantQuota `json:"items"`
}
