package idle

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
)

// Options configure Setup.
type Options struct {
	// LeaseNamespace holds the plugins' use Leases (the chart's namespace).
	LeaseNamespace string
	// Kueue: Deactivate may patch Kueue Workloads.
	Kueue  bool
	Events events.EventRecorder
}

// Setup adds the idle policy's reconciler to the manager (leader only). It
// expects catalog.IndexClaimClasses on ResourceClaims (the controller's
// setup registers it).
func Setup(mgr ctrl.Manager, opts Options) error {
	RegisterMetrics()
	c := mgr.GetClient()
	r := &Reconciler{Client: c, Live: mgr.GetAPIReader(), Events: opts.Events,
		LeaseNamespace: opts.LeaseNamespace, Kueue: opts.Kueue, Now: time.Now}
	err := ctrl.NewControllerManagedBy(mgr).Named("idlepolicy").
		For(&resourceapi.ResourceClaim{}, builder.WithPredicates(claimOfOurs)).
		// The admins' policies: a TenantQuota's spec and the namespaces it
		// resolved, a GpuProfile's spec, a Namespace's labels.
		Watches(&gpuaas.TenantQuota{}, handler.EnqueueRequestsFromMapFunc(tenantClaims(c)), builder.WithPredicates(tenancyChanged)).
		Watches(&gpuaas.GpuProfile{}, handler.EnqueueRequestsFromMapFunc(profileClaims(c)), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(namespaceClaims(c)), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the idle policy controller: %w", err)
	}
	return nil
}

// claimOfOurs passes claims with a device of ours allocated, before or after
// an update (a deallocated claim is forgotten).
var claimOfOurs = predicate.Funcs{
	CreateFunc:  func(e event.CreateEvent) bool { return allocatedOurs(e.Object) },
	DeleteFunc:  func(e event.DeleteEvent) bool { return allocatedOurs(e.Object) },
	GenericFunc: func(e event.GenericEvent) bool { return allocatedOurs(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return allocatedOurs(e.ObjectOld) || allocatedOurs(e.ObjectNew)
	},
}

// allocatedOurs tells whether a claim has a device of ours allocated.
func allocatedOurs(obj client.Object) bool {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	return ok && len(ourDevices(claim)) > 0
}

// tenancyChanged passes a TenantQuota's spec changes and changes of the
// namespaces it resolved, not its other status writes (usage, every resync).
var tenancyChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(*gpuaas.TenantQuota)
		cur, okNew := e.ObjectNew.(*gpuaas.TenantQuota)
		return !okOld || !okNew || old.Generation != cur.Generation ||
			!equality.Semantic.DeepEqual(old.Status.Namespaces, cur.Status.Namespaces)
	},
}

func tenantClaims(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		q, ok := obj.(*gpuaas.TenantQuota)
		if !ok {
			return nil
		}
		var out []reconcile.Request
		for _, ns := range q.Status.Namespaces {
			out = append(out, claimsOf(ctx, c, client.InNamespace(ns))...)
		}
		return out
	}
}

func profileClaims(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		return claimsOf(ctx, c, client.MatchingFields{catalog.IndexClaimClasses: obj.GetName()})
	}
}

func namespaceClaims(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		return claimsOf(ctx, c, client.InNamespace(obj.GetName()))
	}
}

// claimsOf are the allocated claims of ours the list options select.
func claimsOf(ctx context.Context, c client.Reader, opts ...client.ListOption) []reconcile.Request {
	var list resourceapi.ResourceClaimList
	if err := c.List(ctx, &list, opts...); err != nil {
		klog.FromContext(ctx).Error(err, "Listing claims for the idle policy")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if allocatedOurs(&list.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}})
		}
	}
	return out
}
