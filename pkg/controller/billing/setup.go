package billing

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Options configure Setup.
type Options struct {
	// Currency of every price (--billing-currency).
	Currency string
	// Resync is how often open records' lastSeen is written.
	Resync time.Duration
	// Shapes: the GpuShape CRD is served, so shapes can be priced.
	Shapes bool
	// RetentionMonths is how many months past its end a TenantUsage is
	// kept (--billing-retention-months); 0 keeps them all.
	RetentionMonths int
}

// everything is the one request: every event brings all records up to date.
var everything = reconcile.Request{NamespacedName: types.NamespacedName{Name: "billing"}}

// Setup adds the billing recorder to the manager (leader only: a
// controller's reconciles run on the leader).
func Setup(mgr ctrl.Manager, meter Meter, opts Options) (*Recorder, error) {
	r := &Recorder{Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Meter: meter,
		Currency: opts.Currency, Resync: opts.Resync, Now: time.Now, Shapes: opts.Shapes,
		RetentionMonths: opts.RetentionMonths, Events: mgr.GetEventRecorder("gpuaas-dra-controller")}
	RegisterMetrics(r)
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{everything}
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("billing").
		Watches(&resourceapi.ResourceClaim{}, all).
		Watches(&gpuaas.GpuProfile{}, all).
		// A budget set or changed is judged at once; the quota's status
		// writes (nearly every admission) are not events here.
		Watches(&gpuaas.TenantQuota{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	if opts.Shapes {
		b = b.Watches(&gpuaas.GpuShape{}, all)
	}
	if err := b.Complete(r); err != nil {
		return nil, fmt.Errorf("setting up the billing recorder: %w", err)
	}
	return r, nil
}
