package shapes

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/enqueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/kinds"
)

// countDelay coalesces bursts of slice and claim events into one recount
// of every shape's placeable (each lists every slice and claim).
const countDelay = time.Second

// TemplateCache is how the manager's cache must hold
// ResourceClaimTemplates: only those that carry ShapeLabel, so the
// controller does not keep every tenant's templates in memory.
func TemplateCache() cache.ByObject {
	req, err := labels.NewRequirement(gpuaas.ShapeLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant label key
	}
	return cache.ByObject{Label: labels.NewSelector().Add(*req)}
}

// Setup adds the GpuShape controller to the manager (whose cache holds
// templates as TemplateCache says) and returns the claim webhook's
// Refuser and the leader's caches of other drivers' slices (for the
// controller's count of what it caches). Without the GpuShape CRD (a helm
// upgrade skips crds/; --apply-crds installs it) it logs and returns nils.
func Setup(ctx context.Context, mgr ctrl.Manager, resync time.Duration) (*Refuser, client.Reader, error) {
	RegisterMetrics()
	served, err := servesShapes(ctx, mgr.GetRESTMapper())
	if err != nil {
		return nil, nil, err
	}
	if !served {
		klog.FromContext(ctx).Error(nil, "The GpuShape CRD is not installed: shapes are not rendered; install the chart's crds/ (helm upgrade skips them) and restart the controller")
		return nil, nil, nil
	}
	// Every replica's claim webhook reads shapes (Refuser), the leader's
	// controller too: start their informer with the cache, so the first
	// review does not wait for it and the readiness check covers it.
	if _, err := mgr.GetCache().GetInformer(ctx, &gpuaas.GpuShape{}); err != nil {
		return nil, nil, fmt.Errorf("starting the GpuShape informer: %w", err)
	}
	drains, err := kinds.Served(mgr.GetRESTMapper(), schema.GroupKind{Group: resourceapi.GroupName, Kind: "DeviceTaintRule"}, resourceapi.SchemeGroupVersion.Version)
	if err != nil {
		return nil, nil, err
	}
	foreign, err := newForeignCaches(mgr)
	if err != nil {
		return nil, nil, err
	}
	c := mgr.GetClient()
	every := handler.EnqueueRequestsFromMapFunc(allShapes(c))
	recount := enqueue.Delayed(countDelay, allShapes(c))
	r := NewReconciler(c, mgr.GetAPIReader(), resync).withForeignCaches(foreign)
	b := ctrl.NewControllerManagedBy(mgr).Named("gpushape").
		// Its own status writes change no generation.
		For(&gpuaas.GpuShape{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&resourceapi.ResourceClaimTemplate{}, handler.EnqueueRequestsFromMapFunc(templateShape)).
		Watches(&gpuaas.TenantQuota{}, every, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, every, builder.WithPredicates(namespaceChanged)).
		Watches(&gpuaas.GpuProfile{}, every, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&resourceapi.DeviceClass{}, every).
		Watches(&resourceapi.ResourceSlice{}, recount).
		WatchesRawSource(source.Channel(foreign.events, recount)).
		Watches(&resourceapi.ResourceClaim{}, recount, builder.WithPredicates(allocationChanged))
	if drains {
		// resource.k8s.io/v1 DeviceTaintRules are GA in 1.37: on older
		// clusters a watch on them would never sync, and the count does
		// not see admins' drains (docs/platform.md).
		r = r.WithDrains()
		b = b.Watches(&resourceapi.DeviceTaintRule{}, recount)
	}
	if err := b.Complete(r); err != nil {
		return nil, nil, fmt.Errorf("setting up GpuShape controller: %w", err)
	}
	return NewRefuser(c), foreign, nil
}

// namespaceChanged: a namespace created, deleted, relabeled (quotas select
// by labels) or set terminating.
var namespaceChanged = predicate.Or[client.Object](predicate.LabelChangedPredicate{}, predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
})

// allocationChanged: a claim created or deleted, or its allocation set or
// cleared; the rest of its life changes no count.
var allocationChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*resourceapi.ResourceClaim)
		n, ok2 := e.ObjectNew.(*resourceapi.ResourceClaim)
		return !ok1 || !ok2 || (o.Status.Allocation == nil) != (n.Status.Allocation == nil)
	},
}

func templateShape(_ context.Context, obj client.Object) []reconcile.Request {
	if name := obj.GetLabels()[gpuaas.ShapeLabel]; name != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: name}}}
	}
	return nil
}

func allShapes(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list gpuaas.GpuShapeList
		if err := c.List(ctx, &list); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for _, s := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: s.Name}})
		}
		return out
	}
}

// shapeWait is how long setup waits for the GpuShape CRD to be served:
// ApplyCRDs may have created it a moment ago.
const shapeWait = 15 * time.Second

func servesShapes(ctx context.Context, m meta.RESTMapper) (bool, error) {
	gk := gpuaas.GroupVersion.WithKind(gpuaas.GpuShapeKind).GroupKind()
	return kinds.ServedWithin(ctx, m, gk, gpuaas.GroupVersion.Version, shapeWait)
}
