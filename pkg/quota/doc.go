// Package quota is the pure arithmetic of the GPU service's quotas: what a
// ResourceClaim costs in GPU units, GPU memory and devices per profile,
// what a tenant holds, and whether a new claim is admitted, with a reason
// that names tenant, resource, used, requested and limit.
//
// A device's weight in GPU units is exact: a whole GPU is 1, a MIG device
// its compute slices over the GPU's, a time-slice replica 1/N, a memory
// share its memory over the GPU's. Units are rationals (math/big), so seven
// 1g MIG slices add up to exactly one GPU and no rounding lets a tenant
// slip past its limit.
//
// The package imports no client code: callers hand it ResourceSlices,
// DeviceClasses, claims and TenantQuotas, and it is tested without a
// cluster.
package quota
