// Package shapes is the dra-controller's shape plane: the GpuShape
// reconciler that renders each shape (pkg/shape) into a
// ResourceClaimTemplate of its name in every namespace of the TenantQuotas
// it entitles, keeps those templates as the shape says (re-created when
// deleted, reverted when edited, removed from namespaces no longer
// entitled), names missing parts in its conditions, and keeps its
// placeable count (status and the gpuaas_shape_placeable metric) current
// as ResourceSlices and claims change. It runs on the leader only; the
// claim webhook reads the shapes' status from the shared cache.
package shapes
