package controller

import (
	"context"
	"fmt"
	"k8s.io/klog/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
)

// watchChanges keeps the accountant's snapshots fresh and tells the nudger
// when quota frees up. These handlers run on every replica, leader or not:
// the webhook needs them everywhere.
func watchChanges(ctx context.Context, c cache.Cache, acct *Accountant, n *nudger) error {
	catalogChanged := onAny(func(any) { acct.InvalidateCatalog() })
	tenancy := onAny(func(any) { acct.InvalidateTenancy() })
	for _, w := range []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{
		{&resourceapi.ResourceSlice{}, catalogChanged},
		{&resourceapi.DeviceClass{}, catalogChanged},
		{&gpuaas.GpuProfile{}, catalogChanged},
		{&corev1.Namespace{}, tenancy},
		{&gpuaas.TenantQuota{}, quotaHandler(acct, n)},
		{&resourceapi.ResourceClaim{}, claimHandler(acct, n)},
	} {
		inf, err := c.GetInformer(ctx, w.obj)
		if err != nil {
			return fmt.Errorf("getting informer for %T: %w", w.obj, err)
		}
		reg, err := inf.AddEventHandler(w.h)
		if err != nil {
			return fmt.Errorf("watching %T: %w", w.obj, err)
		}
		if _, ok := w.obj.(*resourceapi.ResourceClaim); ok {
			go observeClaimList(ctx, inf, reg, acct)
		}
	}
	return nil
}

// observeClaimList gives the accountant the claim cache's position once
// its handler has been given the initial list: the list's resourceVersion,
// which no claim event need follow (a replica started after the last
// change would otherwise never know how far its cache is).
func observeClaimList(ctx context.Context, inf cache.Informer, reg toolscache.ResourceEventHandlerRegistration, acct *Accountant) {
	lister, ok := inf.(interface{ LastSyncResourceVersion() string })
	if !ok {
		return
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return
	}
	rv := lister.LastSyncResourceVersion()
	acct.ObserveClaimVersion(rv)
	klog.FromContext(ctx).V(2).Info("ResourceClaim cache synced", "resourceVersion", rv)
}

// quotaHandler invalidates the tenancy when a quota comes, goes or changes
// its spec (its generation). Not on a status write: the reconciler writes
// the status of a quota whose usage changed, after nearly every admission,
// and a new tenancy rebuilds every cohort's running total.
func quotaHandler(acct *Accountant, n *nudger) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { acct.InvalidateTenancy() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*gpuaas.TenantQuota)
			q, ok2 := newObj.(*gpuaas.TenantQuota)
			if !ok1 || !ok2 || o.Generation != q.Generation {
				acct.InvalidateTenancy()
			}
			n.Kick()
		},
		DeleteFunc: func(any) { acct.InvalidateTenancy(); n.Kick() },
	}
}

func onAny(f func(any)) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    f,
		UpdateFunc: func(_, obj any) { f(obj) },
		DeleteFunc: f,
	}
}

// claimHandler drops a deleted claim's cached charge and kicks the nudger
// when a claim goes or gives its devices back.
func claimHandler(acct *Accountant, n *nudger) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				acct.ClaimChanged(c.Namespace)
				acct.ObserveClaimVersion(c.ResourceVersion)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*resourceapi.ResourceClaim)
			c, ok2 := newObj.(*resourceapi.ResourceClaim)
			if !ok1 || !ok2 {
				return
			}
			acct.ClaimChanged(c.Namespace)
			acct.ObserveClaimVersion(c.ResourceVersion)
			if o.Status.Allocation != nil && c.Status.Allocation == nil {
				n.Kick()
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				acct.ClaimChanged(c.Namespace)
				acct.ForgetClaim(c.UID)
				acct.ObserveClaimVersion(c.ResourceVersion)
			}
			n.Kick()
		},
	}
}

// Map functions for the reconcilers' watches. A list that fails maps to
// nothing: the periodic resync catches up.

func allOf(list func(context.Context) ([]string, error)) func(context.Context, client.Object) []reconcile.Request {
	return func(ctx context.Context, _ client.Object) []reconcile.Request {
		names, err := list(ctx)
		if err != nil {
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(names))
		for _, n := range names {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: n}})
		}
		return reqs
	}
}

func profileNames(c client.Reader) func(context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		var list gpuaas.GpuProfileList
		if err := c.List(ctx, &list); err != nil {
			return nil, err
		}
		names := make([]string, 0, len(list.Items))
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		return names, nil
	}
}

func quotaNames(c client.Reader) func(context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		var list gpuaas.TenantQuotaList
		if err := c.List(ctx, &list); err != nil {
			return nil, err
		}
		names := make([]string, 0, len(list.Items))
		for _, q := range list.Items {
			names = append(names, q.Name)
		}
		return names, nil
	}
}

// claimProfiles maps a claim to the profiles (= classes) it names.
func claimProfiles(_ context.Context, obj client.Object) []reconcile.Request {
	var reqs []reconcile.Request
	for _, class := range catalog.ClaimClasses(obj) {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: class}})
	}
	return reqs
}

// claimQuota maps a claim to the quota of its namespace.
func claimQuota(acct *Accountant) func(context.Context, client.Object) []reconcile.Request {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		owner, err := acct.NamespaceOwner(ctx, obj.GetNamespace())
		if err != nil || owner == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: owner}}}
	}
}

// sameName maps a DeviceClass to the profile of the same name (owned or
// conflicting).
func sameName(_ context.Context, obj client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: obj.GetName()}}}
}

// statusDelay coalesces bursts of claim and slice events into one status
// recount of a profile: its counts list every claim, which must not happen
// once per event when hundreds of claims change at once.
const statusDelay = time.Second

// delayed enqueues what fn maps an event to after delay; requests already
// waiting are not added twice.
func delayed(delay time.Duration, fn handler.MapFunc) handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	add := func(ctx context.Context, obj client.Object, q queue) {
		for _, r := range fn(ctx, obj) {
			q.AddAfter(r, delay)
		}
	}
	return handler.Funcs{
		CreateFunc:  func(ctx context.Context, e event.CreateEvent, q queue) { add(ctx, e.Object, q) },
		UpdateFunc:  func(ctx context.Context, e event.UpdateEvent, q queue) { add(ctx, e.ObjectNew, q) },
		DeleteFunc:  func(ctx context.Context, e event.DeleteEvent, q queue) { add(ctx, e.Object, q) },
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q queue) { add(ctx, e.Object, q) },
	}
}
