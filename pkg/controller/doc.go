// Package controller is the dra-controller: the reconcilers that keep the
// GPU catalog (GpuProfile -> DeviceClass) and tenant quota status current,
// and the validating admission webhook that charges ResourceClaims against
// TenantQuotas and validates our opaque configuration. It is thin wiring
// over pkg/deviceclass and pkg/quota, on controller-runtime.
//
// Every replica serves the webhook from its informer caches; only the
// leader reconciles. Usage is always rebuilt from the API (claims and their
// allocations), never kept in memory alone: the in-memory state is a cache
// of prices and a few seconds of admitted-but-not-yet-visible claims.
package controller
