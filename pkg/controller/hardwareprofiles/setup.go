package hardwareprofiles

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Config says where the catalog is published.
type Config struct {
	// Namespace holds every GpuProfile's HardwareProfile; empty: none.
	Namespace string
	// PerTenant publishes every GpuProfile in each tenant's namespaces.
	PerTenant bool
	Resync    time.Duration
}

// Setup adds the profiles' and the shapes' publishers to the manager;
// direct is an uncached client.
func Setup(mgr ctrl.Manager, direct client.Client, cfg Config) error {
	r := &Reconciler{Client: mgr.GetClient(), Direct: direct, Mapper: mgr.GetRESTMapper(),
		Namespace: cfg.Namespace, PerTenant: cfg.PerTenant, Resync: cfg.Resync}
	// The spec (its generation: deletion bumps it too), not the status
	// the catalog rewrites on every claim's allocation: nothing rendered
	// comes from a profile's status.
	profiles := ctrl.NewControllerManagedBy(mgr).Named("hardwareprofile").
		For(&gpuaas.GpuProfile{}, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	if cfg.PerTenant {
		profiles = profiles.Watches(&gpuaas.TenantQuota{}, everyOne(mgr.GetClient(), &gpuaas.GpuProfileList{}), builder.WithPredicates(tenantsMoved()))
	}
	if err := profiles.Complete(ProfileReconciler{r}); err != nil {
		return fmt.Errorf("setting up the HardwareProfile controller: %w", err)
	}
	// A shape's spec, and where its templates are (its status.namespaces).
	err := ctrl.NewControllerManagedBy(mgr).Named("hardwareprofile-shape").
		For(&gpuaas.GpuShape{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, templatesMoved()))).
		Watches(&gpuaas.TenantQuota{}, everyOne(mgr.GetClient(), &gpuaas.GpuShapeList{}), builder.WithPredicates(tenantsMoved())).
		Complete(ShapeReconciler{r})
	if err != nil {
		return fmt.Errorf("setting up the shapes' HardwareProfile controller: %w", err)
	}
	return nil
}

// everyOne enqueues every object of list's kind (profiles or shapes): a
// tenant's namespaces or Kueue settings decide where each is published.
func everyOne(c client.Reader, list client.ObjectList) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := c.List(ctx, l); err != nil {
			return nil // the resync catches it
		}
		var out []reconcile.Request
		switch l := l.(type) {
		case *gpuaas.GpuProfileList:
			for i := range l.Items {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
			}
		case *gpuaas.GpuShapeList:
			for i := range l.Items {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
			}
		}
		return out
	})
}

// tenantsMoved passes a TenantQuota made or deleted, and one whose
// resolved namespaces or Kueue settings changed; not its usage, which its
// status rewrites on every claim.
func tenantsMoved() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		before, ok1 := e.ObjectOld.(*gpuaas.TenantQuota)
		after, ok2 := e.ObjectNew.(*gpuaas.TenantQuota)
		return !ok1 || !ok2 || !slices.Equal(before.Status.Namespaces, after.Status.Namespaces) ||
			!equality.Semantic.DeepEqual(before.Spec.Kueue, after.Spec.Kueue)
	}}
}

// templatesMoved passes a shape whose templates' namespaces changed.
func templatesMoved() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		before, ok1 := e.ObjectOld.(*gpuaas.GpuShape)
		after, ok2 := e.ObjectNew.(*gpuaas.GpuShape)
		return !ok1 || !ok2 || !slices.Equal(before.Status.Namespaces, after.Status.Namespaces)
	}}
}
