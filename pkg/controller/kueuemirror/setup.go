package kueuemirror

import (
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Setup adds the Kueue mirror's reconcilers to the manager: the mappings
// ConfigMap and the ResourceFlavor from the catalog, and a ClusterQueue per
// TenantQuota with spec.kueue; shapes tells whether the GpuShape CRD is
// served (the classes shapes name are mapped too); prices prices the profiles pods
// ask as extended resources (nil: none). direct is an uncached client: Kueue's kinds
// may be installed after the controller starts, and the ConfigMap in
// namespace needs no cluster-wide informer. resync retries what Kueue's
// absence left undone.
func Setup(mgr ctrl.Manager, direct client.Client, namespace string, resync time.Duration, shapes bool, prices Prices) error {
	r := &kueueMappingsReconciler{profiles: mgr.GetClient(), direct: direct, namespace: namespace, resync: resync, shapes: shapes, prices: prices}
	if err := r.setup(mgr); err != nil {
		return fmt.Errorf("setting up the Kueue mappings controller: %w", err)
	}
	queues := &kueueQueueReconciler{quotas: mgr.GetClient(), direct: direct, resync: resync}
	if err := queues.setup(mgr); err != nil {
		return fmt.Errorf("setting up the Kueue ClusterQueue controller: %w", err)
	}
	return nil
}
