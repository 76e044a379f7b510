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
//
// The planes that stand alone are sub-packages, wired in by Run: catalog
// (GpuProfile -> DeviceClass, reading the books only through
// catalog.Devices), gpunode (the GpuNode posture reconciler and its
// metrics), webhookcert (the webhook's serving certificates and their
// rotation) and kueuemirror (Kueue's mappings, ResourceFlavor and
// ClusterQueues kept in line with the catalog and the quotas). What stays
// here is the wiring (run.go, options.go, watch.go, metrics.go), admission
// and the quota books (accountant.go, admit.go, cohort.go, ledger.go,
// reclaim.go, the Kueue gate, webhooks.go; a reservation's lifecycle is
// decided in reservation.go alone), and the quota reconciler, which reads
// the books' Accountant.
package controller
