package billingreaders

import (
	"context"
	"fmt"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Cache is what the manager's cache holds of ClusterRoles and
// ClusterRoleBindings: ours only, not the cluster's hundreds.
func Cache() cache.ByObject {
	return cache.ByObject{Label: labels.SelectorFromSet(labels.Set{Label: "true"})}
}

// Setup adds the reconciler to the manager (leader only). Its objects'
// changes (a hand edit) and a tenant's TenantUsage made or deleted bring
// the tenant's quota back.
func Setup(mgr ctrl.Manager) error {
	r := &Reconciler{Client: mgr.GetClient(), Now: time.Now}
	usages := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		u, ok := obj.(*gpuaas.TenantUsage)
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: u.Spec.Tenant}}}
	})
	// A TenantUsage's status is written every resync: only its coming and
	// going change the names.
	comeAndGo := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	err := ctrl.NewControllerManagedBy(mgr).Named("billing-readers").
		For(&gpuaas.TenantQuota{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&rbacv1.ClusterRole{}).
		Owns(&rbacv1.ClusterRoleBinding{}).
		Watches(&gpuaas.TenantUsage{}, usages, builder.WithPredicates(comeAndGo)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the billing readers controller: %w", err)
	}
	return nil
}
