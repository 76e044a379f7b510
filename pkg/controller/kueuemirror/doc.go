// Package kueuemirror keeps Kueue's side of the catalog and the quotas in
// line with ours, when the controller runs with Kueue: the
// deviceClassMappings rendered from the GpuProfiles into a ConfigMap (for
// Kueue's configuration, which Kueue reads at start only), the
// ResourceFlavor those mappings name, and a ClusterQueue mirroring each
// TenantQuota with spec.kueue. What it renders is pkg/kueue's; the Kueue
// gate that lets admitted workloads' claims through is admission's
// (pkg/controller). Kueue is optional: its objects are unstructured, and
// without its CRDs the mirror waits.
package kueuemirror
