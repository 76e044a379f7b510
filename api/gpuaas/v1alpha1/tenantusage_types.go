package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Price is what a profile's or a shape's devices cost while allocated, in
// the cluster's one currency (the controller's --billing-currency).
type Price struct {
	// PerGpuUnitHour is the price of one GPU unit held for one hour
	// ("2.50"): a whole GPU is one unit, a 1g slice of a 7-slice GPU 1/7,
	// a share of a shared GPU its memory's fraction, so that a slice or a
	// share costs its part of the GPU at the same rate.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="perGpuUnitHour must not be negative"
	PerGpuUnitHour resource.Quantity `json:"perGpuUnitHour"`
}

// TenantUsage is one tenant's billed usage over one period (a UTC calendar
// month), written by the dra-controller's leader only: the allocation
// intervals still open and the closed ones rolled up per profile, GPU
// model, node and price (docs/platform.md, "Billing"). Its name is
// <tenant>-<yyyy-mm>.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=tu,categories=gpuaas
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Tenant",type=string,JSONPath=`.spec.tenant`
// +kubebuilder:printcolumn:name="Period",type=string,JSONPath=`.spec.period`
// +kubebuilder:printcolumn:name="Unit-Seconds",type=string,JSONPath=`.status.unitSeconds`
// +kubebuilder:printcolumn:name="Cost",type=string,JSONPath=`.status.cost`
// +kubebuilder:printcolumn:name="Currency",type=string,JSONPath=`.status.currency`
// +kubebuilder:printcolumn:name="Open",type=integer,JSONPath=`.status.openRecords`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TenantUsage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantUsageSpec   `json:"spec"`
	Status TenantUsageStatus `json:"status,omitempty"`
}

// TenantUsageSpec names the tenant and the period.
type TenantUsageSpec struct {
	// Tenant is the TenantQuota's name.
	// +kubebuilder:validation:MaxLength=253
	Tenant string `json:"tenant"`
	// Period is the UTC calendar month, yyyy-mm.
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-[0-9]{2}$`
	Period string `json:"period"`
	// Start and End bound the period: [start, end).
	Start metav1.Time `json:"start"`
	End   metav1.Time `json:"end"`
}

// TenantUsageStatus is the period's records.
type TenantUsageStatus struct {
	// Currency of every price and cost here.
	// +optional
	Currency string `json:"currency,omitempty"`
	// UnitSeconds is the period's GPU-unit-seconds so far: the closed
	// records and the open ones up to their lastSeen. An exact rational
	// ("90", "30/7").
	// +optional
	UnitSeconds string `json:"unitSeconds,omitempty"`
	// Cost is the period's cost so far, the same way, to six decimals.
	// +optional
	Cost string `json:"cost,omitempty"`
	// UsedUnitSeconds, IdleUnitSeconds and UnknownUseUnitSeconds split
	// unitSeconds by the device's use, the same way: in use, idle (the
	// plugin's Idle condition True: held, billed, unused) and unknown (no
	// condition, Unknown, or not observed). Unknown is the rest:
	// unitSeconds - used - idle.
	// +optional
	UsedUnitSeconds string `json:"usedUnitSeconds,omitempty"`
	// +optional
	IdleUnitSeconds string `json:"idleUnitSeconds,omitempty"`
	// +optional
	UnknownUseUnitSeconds string `json:"unknownUseUnitSeconds,omitempty"`
	// OpenRecords counts open.
	// +optional
	OpenRecords int32 `json:"openRecords,omitempty"`
	// Open are the allocation intervals still running: one per claim and
	// allocated device, with the price that applies.
	// +listType=atomic
	// +optional
	Open []UsageRecord `json:"open,omitempty"`
	// Recent are the last closed records (at most 64, newest last), for
	// audit; every closed record is in totals.
	// +listType=atomic
	// +optional
	Recent []UsageRecord `json:"recent,omitempty"`
	// Totals roll the closed records up per profile (or shape), GPU
	// model, node and price. Past 256 entries a new one is folded into
	// its entry without a node (node "").
	// +listType=atomic
	// +optional
	Totals []UsageTotal `json:"totals,omitempty"`
}

// UsageRecord is one claim's hold of one device at one price over
// [start, end).
type UsageRecord struct {
	// Tenant, Namespace and Claim say who held the device.
	Tenant    string    `json:"tenant"`
	Namespace string    `json:"namespace"`
	Claim     string    `json:"claim"`
	ClaimUID  types.UID `json:"claimUID"`
	// Pods the claim was reserved for when last seen (at most 16).
	// +listType=atomic
	// +optional
	Pods []string `json:"pods,omitempty"`
	// Device is the allocated device, pool/device (the pool is the node).
	Device string `json:"device"`
	// Profile is the DeviceClass (GpuProfile) of the request that got it.
	// +optional
	Profile string `json:"profile,omitempty"`
	// Shape is the GpuShape the claim is an instance of, when priced by
	// the shape.
	// +optional
	Shape string `json:"shape,omitempty"`
	// GpuModel is the device's productName attribute.
	// +optional
	GpuModel string `json:"gpuModel,omitempty"`
	// Node is the device's pool.
	Node string `json:"node"`
	// Units is the GPU units held, an exact rational ("1", "1/7").
	Units string `json:"units"`
	// Memory is the GPU memory held.
	// +optional
	Memory resource.Quantity `json:"memory,omitempty"`
	// Start is when the leader first saw the device allocated (or the
	// price that applies set, or the period begin).
	Start metav1.Time `json:"start"`
	// LastSeen is the leader's last observation of the allocation, written
	// every resync: a record whose claim went while no leader ran ends here.
	LastSeen metav1.Time `json:"lastSeen"`
	// End is when the allocation went (or the price changed, or the period
	// ended); unset while open.
	// +optional
	End *metav1.Time `json:"end,omitempty"`
	// EndUncertain: the allocation went while no leader ran, somewhere in
	// [end, uncertainUntil]; it is billed up to end only.
	// +optional
	EndUncertain bool `json:"endUncertain,omitempty"`
	// +optional
	UncertainUntil *metav1.Time `json:"uncertainUntil,omitempty"`
	// UnitSeconds is units times the seconds of [start, end) (of
	// [start, lastSeen) while open), exact.
	UnitSeconds string `json:"unitSeconds"`
	// UsedUnitSeconds and IdleUnitSeconds are the part of unitSeconds the
	// device's Idle condition (written by the node's plugin) said False (in
	// use) and True (idle); UnknownUseUnitSeconds is the rest: no
	// condition, Unknown, or a stretch no leader observed. Exact.
	// +optional
	UsedUnitSeconds string `json:"usedUnitSeconds,omitempty"`
	// +optional
	IdleUnitSeconds string `json:"idleUnitSeconds,omitempty"`
	// +optional
	UnknownUseUnitSeconds string `json:"unknownUseUnitSeconds,omitempty"`
	// Use is the device's use as last accounted (Used, Idle or Unknown),
	// since UseSince: the state a new leader goes on from. Open records
	// only.
	// +kubebuilder:validation:Enum=Used;Idle;Unknown
	// +optional
	Use DeviceUse `json:"use,omitempty"`
	// +optional
	UseSince *metav1.Time `json:"useSince,omitempty"`
	// Price is the price per GPU-unit-hour that applied; zero when the
	// profile (or shape) has none.
	// +optional
	Price resource.Quantity `json:"price,omitempty"`
	// Cost is unitSeconds / 3600 * price, to six decimals.
	Cost string `json:"cost"`
}

// DeviceUse is what a record accounts a device's time as.
type DeviceUse string

// The uses of a device (docs/platform.md, "Billing").
const (
	DeviceUsed       DeviceUse = "Used"
	DeviceIdle       DeviceUse = "Idle"
	DeviceUseUnknown DeviceUse = "Unknown"
)

// UsageTotal is the closed records of one profile (or shape), GPU model,
// node and price, rolled up.
type UsageTotal struct {
	// +optional
	Profile string `json:"profile,omitempty"`
	// +optional
	Shape string `json:"shape,omitempty"`
	// +optional
	GpuModel string `json:"gpuModel,omitempty"`
	// Node is "" for the entries folded past the bound.
	// +optional
	Node string `json:"node,omitempty"`
	// +optional
	Price resource.Quantity `json:"price,omitempty"`
	// Records closed into this entry, and of them those whose end is
	// uncertain.
	Records int64 `json:"records"`
	// +optional
	UncertainRecords int64  `json:"uncertainRecords,omitempty"`
	UnitSeconds      string `json:"unitSeconds"`
	// Used, idle and unknown-use unit-seconds of the records, as theirs.
	// +optional
	UsedUnitSeconds string `json:"usedUnitSeconds,omitempty"`
	// +optional
	IdleUnitSeconds string `json:"idleUnitSeconds,omitempty"`
	// +optional
	UnknownUseUnitSeconds string `json:"unknownUseUnitSeconds,omitempty"`
	Cost                  string `json:"cost"`
}

// TenantUsageList is a list of TenantUsage.
//
// +kubebuilder:object:root=true
type TenantUsageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantUsage `json:"items"`
}
