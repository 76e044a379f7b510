package controller

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
)

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
func claimQuota(acct *admission.Accountant) func(context.Context, client.Object) []reconcile.Request {
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
