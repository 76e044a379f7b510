package admission

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Watch keeps the accountant's snapshots fresh and tells the nudger
// when quota frees up. These handlers run on every replica, leader or not:
// the webhook needs them everywhere.
func Watch(ctx context.Context, c cache.Cache, acct *Accountant, n *Nudger) error {
	tenancy := onAny(func(any) { acct.invalidateTenancy() })
	for _, w := range []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{
		{&resourceapi.ResourceSlice{}, CatalogHandler(&resourceapi.ResourceSlice{}, acct.InvalidateCatalog)},
		{&resourceapi.DeviceClass{}, CatalogHandler(&resourceapi.DeviceClass{}, acct.InvalidateCatalog)},
		{&gpuaas.GpuProfile{}, CatalogHandler(&gpuaas.GpuProfile{}, acct.InvalidateCatalog)},
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
	acct.observeClaimVersion(rv)
	klog.FromContext(ctx).V(2).Info("ResourceClaim cache synced", "resourceVersion", rv)
}

// quotaHandler invalidates the tenancy when a quota comes, goes or changes
// its spec (its generation), or its budget's refusal (BudgetStateChanged).
// Not on another status write: the reconciler writes
// the status of a quota whose usage changed, after nearly every admission,
// and a new tenancy rebuilds every cohort's running total.
func quotaHandler(acct *Accountant, n *Nudger) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { acct.invalidateTenancy() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*gpuaas.TenantQuota)
			q, ok2 := newObj.(*gpuaas.TenantQuota)
			// A budget exhausted or lifted is a status write the claim
			// webhook acts on; it is rare.
			if !ok1 || !ok2 || o.Generation != q.Generation || BudgetStateChanged(o, q) {
				acct.invalidateTenancy()
			}
			n.Kick()
		},
		DeleteFunc: func(any) { acct.invalidateTenancy(); n.Kick() },
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
func claimHandler(acct *Accountant, n *Nudger) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				acct.ClaimChanged(c.Namespace)
				acct.observeClaimVersion(c.ResourceVersion)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*resourceapi.ResourceClaim)
			c, ok2 := newObj.(*resourceapi.ResourceClaim)
			if !ok1 || !ok2 {
				return
			}
			acct.ClaimChanged(c.Namespace)
			acct.observeClaimVersion(c.ResourceVersion)
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
				acct.forgetClaim(c.UID)
				acct.observeClaimVersion(c.ResourceVersion)
			}
			n.Kick()
		},
	}
}
