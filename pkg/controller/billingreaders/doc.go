// Package billingreaders grants the readers a TenantQuota lists in
// spec.billing.readers get on that tenant's TenantUsages and on no other
// object: a ClusterRole whose one rule is get on gpuaas.io tenantusages by
// name (the tenant's TenantUsages that exist and the current month's), and
// a ClusterRoleBinding of it to the readers. TenantUsages are
// cluster-scoped, so a tenant's own admins, who hold roles in its
// namespaces only, could not read them otherwise (docs/platform.md,
// "Billing").
//
// The TenantQuota owns both (deleting it removes them), the leader keeps
// them as the quota says (a hand edit is put back) and deletes them when
// the readers go. The chart's policy (controller-policy.yaml,
// *-billing-readers) lets the controller's ServiceAccount write no other
// ClusterRole or ClusterRoleBinding.
package billingreaders
