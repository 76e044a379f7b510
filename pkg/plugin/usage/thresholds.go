package usage

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// The cluster-scoped resources whose idle policies set the thresholds.
var (
	gpuProfiles  = gpuaasv1.GroupVersion.WithResource("gpuprofiles")
	tenantQuotas = gpuaasv1.GroupVersion.WithResource("tenantquotas")
)

// PolicyThresholds resolves a claim's idle threshold from read-only
// informers on GpuProfiles and TenantQuotas: the GpuProfile named as the
// device's DeviceClass, if it sets an idle policy; else the TenantQuota
// whose status lists the claim's namespace, if it sets one; else 0 (no use
// at all). Until the CRDs exist every threshold is 0. It also names each
// namespace's tenant (the TenantQuota whose status lists it), the tenant
// label of the use metrics.
type PolicyThresholds struct {
	mu sync.RWMutex
	// byProfile and byNamespace are the thresholds of the policies set.
	byProfile, byNamespace map[string]int32
	// tenants is every TenantQuota's name by the namespaces it lists,
	// with an idle policy or without.
	tenants map[string]string
}

// Tenant implements Tenants: the TenantQuota that lists the namespace in
// its status, "" for none (or until the quotas can be read).
func (p *PolicyThresholds) Tenant(namespace string) string {
	if p == nil {
		return ""
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tenants[namespace]
}

// Threshold implements Thresholds.
func (p *PolicyThresholds) Threshold(namespace, deviceClass string) int32 {
	if p == nil {
		return 0
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if t, ok := p.byProfile[deviceClass]; ok && deviceClass != "" {
		return t
	}
	return p.byNamespace[namespace]
}

// WatchPolicies starts the informers; where the CRDs are not installed it
// says so once and looks again every retry until they are.
func WatchPolicies(ctx context.Context, client dynamic.Interface, retry time.Duration) *PolicyThresholds {
	p := &PolicyThresholds{byProfile: map[string]int32{}, byNamespace: map[string]int32{}, tenants: map[string]string{}}
	if client == nil {
		klog.FromContext(ctx).Info("No API client for idle policies: every idle threshold is 0")
		return p
	}
	go p.watch(ctx, client, retry)
	return p
}

func (p *PolicyThresholds) watch(ctx context.Context, client dynamic.Interface, retry time.Duration) {
	logger := klog.FromContext(ctx)
	told := false
	err := wait.PollUntilContextCancel(ctx, retry, true, func(ctx context.Context) (bool, error) {
		for _, gvr := range []schema.GroupVersionResource{gpuProfiles, tenantQuotas} {
			if _, err := client.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				if !told {
					what := "cannot be read"
					if apierrors.IsNotFound(err) {
						what = "not installed"
					}
					logger.Info("Idle policies "+what+": every idle threshold is 0 until they can be read", "resource", gvr.Resource, "err", err.Error())
					told = true
				}
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return // ctx ended
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(client, 0)
	profiles, quotas := factory.ForResource(gpuProfiles).Informer(), factory.ForResource(tenantQuotas).Informer()
	rebuild := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.rebuild(ctx, profiles.GetStore(), quotas.GetStore()) },
		UpdateFunc: func(any, any) { p.rebuild(ctx, profiles.GetStore(), quotas.GetStore()) },
		DeleteFunc: func(any) { p.rebuild(ctx, profiles.GetStore(), quotas.GetStore()) },
	}
	for _, inf := range []cache.SharedIndexInformer{profiles, quotas} {
		if _, err := inf.AddEventHandler(rebuild); err != nil {
			logger.Error(err, "Watching idle policies")
		}
	}
	factory.Start(ctx.Done())
	logger.Info("Watching idle policies")
}

// rebuild recomputes the thresholds from the informers' stores: there are
// few profiles and quotas, and they change rarely.
func (p *PolicyThresholds) rebuild(ctx context.Context, profiles, quotas cache.Store) {
	byProfile, byNamespace, tenants := map[string]int32{}, map[string]int32{}, map[string]string{}
	for _, obj := range profiles.List() {
		var gp gpuaasv1.GpuProfile
		if fromUnstructured(ctx, obj, &gp) && gp.Spec.IdlePolicy != nil {
			byProfile[gp.Name] = gp.Spec.IdlePolicy.ThresholdPercent
		}
	}
	for _, obj := range quotas.List() {
		var tq gpuaasv1.TenantQuota
		if !fromUnstructured(ctx, obj, &tq) {
			continue
		}
		for _, ns := range tq.Status.Namespaces {
			tenants[ns] = tq.Name
			if tq.Spec.IdlePolicy != nil {
				byNamespace[ns] = tq.Spec.IdlePolicy.ThresholdPercent
			}
		}
	}
	p.mu.Lock()
	p.byProfile, p.byNamespace, p.tenants = byProfile, byNamespace, tenants
	p.mu.Unlock()
}

func fromUnstructured(ctx context.Context, obj any, into any) bool {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return false
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		klog.FromContext(ctx).Error(err, "Reading an idle policy", "name", u.GetName())
		return false
	}
	return true
}
