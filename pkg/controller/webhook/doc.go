// Package webhook serves the controller's admission webhooks: the quota
// webhook on ResourceClaims (deciding through pkg/controller/admission),
// the mutating webhook that drops firstAvailable alternatives the quota
// would refuse (alternatives.go), and the validation of opaque
// configuration, GpuProfiles and TenantQuotas. It renders their
// configurations, writes them or injects the CA into the chart's
// (Registrar), and keeps the matchCondition that sends other drivers'
// claims past a webhook that fails closed (matchconditions.go).
package webhook
