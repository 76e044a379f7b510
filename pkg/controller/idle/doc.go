// Package idle enforces the platform admin's idle policy (docs/idle-policy.md):
// a TenantQuota's spec.idlePolicy, overridden per GpuProfile, acts on
// allocated ResourceClaims of our driver whose devices the node's plugin
// reports idle (the device status condition Idle) for longer than the
// policy's Duration: it warns, waits the policy's Warning, then notifies,
// deactivates the pods' Kueue Workload or evicts the pods.
//
// It acts only on evidence the tenant cannot write: the Idle conditions the
// plugin writes into the claim's status, the plugin's use Lease in the
// controller's namespace (fresh, and acquired before the idleness began, so
// a restarted plugin that has not seen the idleness is never believed), the
// admin's policies and the Namespace's labels. A claim whose use is unknown
// on any device is never acted on.
//
// What was warned and done lives in memory only: a new leader warns again
// and gives the full warning period before it acts, and the actions are
// idempotent (a pod gone is not evicted again, an inactive Workload is not
// patched again).
package idle
