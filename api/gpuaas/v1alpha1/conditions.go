package v1alpha1

// Condition types of GpuProfile and TenantQuota status.
const (
	// ConditionReady: GpuProfile: its DeviceClass is in sync with the
	// spec. TenantQuota: the quota is valid and enforced.
	ConditionReady = "Ready"
	// ConditionNamespaceConflict: another, older TenantQuota claims one of
	// this quota's namespaces; that namespace is charged to the other one.
	ConditionNamespaceConflict = "NamespaceConflict"
	// ConditionOverQuota: usage exceeds a limit (the limit was lowered, or
	// the allocation cost more than admitted); new claims are refused
	// until usage drops.
	ConditionOverQuota = "OverQuota"
	// ConditionFieldsDropped: GpuProfile: the API server drops a field of
	// the rendered DeviceClass because its feature gate is off; the class
	// is kept without it (the message names the field and the gate).
	ConditionFieldsDropped = "FieldsDropped"
	// ConditionHardwareProfilesPublished: GpuProfile, GpuShape: published
	// as an OpenShift AI HardwareProfile in every namespace it is meant for
	// (status.hardwareProfileNamespaces); False names the namespaces it is
	// not published in and why.
	ConditionHardwareProfilesPublished = "HardwareProfilesPublished"
)

// Condition reasons.
const (
	ReasonDeviceClassReady    = "DeviceClassReady"
	ReasonInvalidSpec         = "InvalidSpec"
	ReasonDeviceClassConflict = "DeviceClassConflict"
	ReasonApplyFailed         = "ApplyFailed"
	ReasonDisabled            = "Disabled"
	ReasonDraining            = "Draining"
	ReasonEnforced            = "Enforced"
	ReasonConflict            = "Conflict"
	ReasonNoConflict          = "NoConflict"
	ReasonWithinLimits        = "WithinLimits"
	ReasonExceeded            = "Exceeded"
	ReasonFeatureGateOff      = "FeatureGateOff"
	// GpuShape: its templates are in sync and every part exists.
	ReasonShapeReady = "TemplatesReady"
	// GpuShape: a part is missing (a DeviceClass that does not exist, a
	// GpuProfile absent or disabled); the message names it.
	ReasonPartsMissing = "PartsMissing"
	// GpuShape: a ResourceClaimTemplate of its name exists in an entitled
	// namespace and was not rendered from the shape.
	ReasonTemplateConflict = "TemplateConflict"
	// HardwareProfilesPublished: in every namespace meant.
	ReasonPublished = "Published"
	// HardwareProfilesPublished: not in some namespace (a Kueue-managed
	// tenant's namespace without a LocalQueue of its ClusterQueue, a
	// HardwareProfile of that name that is not ours, settings that do not
	// hold); the message names each.
	ReasonNotPublished = "NotPublished"
)

// Labels and annotations the control plane uses.
const (
	// ProfileLabel on a DeviceClass names the GpuProfile it was rendered
	// from.
	ProfileLabel = "gpuaas.io/profile"
	// QuotaExemptLabel on a Namespace (any value) keeps its claims out of
	// the quota webhook.
	QuotaExemptLabel = "gpuaas.io/quota-exempt"
	// QuotaRetryAnnotation is set on a pod whose template claim was denied
	// once quota frees up: the update makes the kube-controller-manager
	// retry creating the claim at once instead of after its back-off.
	QuotaRetryAnnotation = "gpuaas.io/quota-retry"
	// DrainFinalizer on a GpuProfile holds its deletion until no claim
	// names its DeviceClass, as disabling it does: without it the class
	// was garbage-collected at once and stranded pending claims.
	DrainFinalizer = "gpuaas.io/drain-device-class"
	// ReleasedAnnotation (an RFC 3339 time) on a GpuProfile says the
	// chart's uninstall hook removed DrainFinalizer at that time: a
	// controller that started earlier must not add it back, or the
	// uninstall would leave the profile stuck with no controller to drain
	// it.
	ReleasedAnnotation = "gpuaas.io/finalizer-released"
	// ShapeLabel on a ResourceClaimTemplate names the GpuShape it was
	// rendered from. It is what the controller finds its templates by,
	// never evidence that a claim is of the shape (a tenant can write it):
	// the claim webhook compares the claim's spec with the template's.
	ShapeLabel = "gpuaas.io/shape"
)
