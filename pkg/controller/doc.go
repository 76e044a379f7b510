// Package controller is the dra-controller's wiring: Run builds the
// manager, and puts on it the planes, each a sub-package, and the
// TenantQuota reconciler, which stays here with its metrics. It is thin wiring over pkg/deviceclass and pkg/quota, on
// controller-runtime.
//
// Every replica serves the webhooks from its informer caches; only the
// leader reconciles. Usage is always rebuilt from the API (claims and their
// allocations), never kept in memory alone: the in-memory state is a cache
// of prices and a few seconds of admitted-but-not-yet-visible claims.
//
// The planes: admission (the quota books and the decision on a new claim:
// the Accountant, its ledger and reservations, cohorts, reclaim, the Kueue
// gate, the nudger, and the informer hooks that keep it current), webhook
// (the admission webhooks served and their configurations, with the
// matchCondition that spares other drivers' claims), catalog (GpuProfile ->
// DeviceClass, reading the books only through catalog.Devices), gpunode
// (the GpuNode posture reconciler), webhookcert (the webhook's serving
// certificates and their rotation) and kueuemirror (Kueue's mappings,
// ResourceFlavor and ClusterQueues kept in line with the catalog and the
// quotas), billing (the usage records, TenantUsage, and the counters
// derived from them). What stays here is run.go, options.go, watch.go (the
// reconcilers' map functions), crds.go, metrics.go, the quota reconciler
// (quota_controller.go) and the ResourceQuota backstop
// (backstop.go), which resolves tenancy from the API on its own.
package controller
