package usage

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func TestUseLeaseCreatedThenRenewed(t *testing.T) {
	client := fake.NewClientset()
	started := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	l := &UseLease{Client: client, Namespace: "gpuaas-system", Node: "node-1", Holder: "plugin-abc_17", Started: started, Interval: 10 * time.Second}
	ctx := context.Background()
	for _, at := range []time.Time{started.Add(time.Second), started.Add(11 * time.Second)} {
		if err := l.Renew(ctx, at); err != nil {
			t.Fatal(err)
		}
		lease, err := client.CoordinationV1().Leases("gpuaas-system").Get(ctx, gpuaasv1.UseLeasePrefix+"node-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if *lease.Spec.HolderIdentity != "plugin-abc_17" || *lease.Spec.LeaseDurationSeconds != 30 ||
			!lease.Spec.AcquireTime.Time.Equal(started) || !lease.Spec.RenewTime.Time.Equal(at) {
			t.Errorf("lease at %s: holder %s, duration %d, acquired %s, renewed %s; want plugin-abc_17, 30, %s, %s", at,
				*lease.Spec.HolderIdentity, *lease.Spec.LeaseDurationSeconds, lease.Spec.AcquireTime, lease.Spec.RenewTime, started, at)
		}
	}
}

func policyObject(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: u}
}

// The profile's policy overrides the tenant's; without either, 0.
func TestPolicyThresholds(t *testing.T) {
	profile := &gpuaasv1.GpuProfile{TypeMeta: metav1.TypeMeta{APIVersion: gpuaasv1.GroupVersion.String(), Kind: "GpuProfile"},
		ObjectMeta: metav1.ObjectMeta{Name: "h100-notebook"},
		Spec:       gpuaasv1.GpuProfileSpec{IdlePolicy: &gpuaasv1.IdlePolicy{ThresholdPercent: 2, Action: gpuaasv1.IdleActionNotify}}}
	quota := &gpuaasv1.TenantQuota{TypeMeta: metav1.TypeMeta{APIVersion: gpuaasv1.GroupVersion.String(), Kind: "TenantQuota"},
		ObjectMeta: metav1.ObjectMeta{Name: "team-a"},
		Spec:       gpuaasv1.TenantQuotaSpec{IdlePolicy: &gpuaasv1.IdlePolicy{ThresholdPercent: 5, Action: gpuaasv1.IdleActionEvict}},
		Status:     gpuaasv1.TenantQuotaStatus{Namespaces: []string{"team-a-dev"}}}
	noPolicy := &gpuaasv1.TenantQuota{TypeMeta: metav1.TypeMeta{APIVersion: gpuaasv1.GroupVersion.String(), Kind: "TenantQuota"},
		ObjectMeta: metav1.ObjectMeta{Name: "team-b"},
		Status:     gpuaasv1.TenantQuotaStatus{Namespaces: []string{"team-b"}}}
	scheme := runtime.NewScheme()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		gpuProfiles: "GpuProfileList", tenantQuotas: "TenantQuotaList"}, policyObject(t, profile), policyObject(t, quota), policyObject(t, noPolicy))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := WatchPolicies(ctx, client, 10*time.Millisecond)
	for p.Threshold("team-a-dev", "other") != 5 {
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range []struct {
		namespace, class string
		want             int32
	}{
		{"team-a-dev", "h100-notebook", 2},
		{"team-a-dev", "other", 5},
		{"team-b", "other", 0},
		{"team-b", "", 0},
	} {
		if got := p.Threshold(c.namespace, c.class); got != c.want {
			t.Errorf("Threshold(%s, %s) = %d, want %d", c.namespace, c.class, got, c.want)
		}
	}
	// The tenant label of the use metrics: the quota listing the
	// namespace, with an idle policy or without.
	for ns, want := range map[string]string{"team-a-dev": "team-a", "team-b": "team-b", "elsewhere": ""} {
		if got := p.Tenant(ns); got != want {
			t.Errorf("Tenant(%s) = %q, want %q", ns, got, want)
		}
	}
}

// Without the CRDs every threshold is 0, and nothing crashes.
func TestPolicyThresholdsWithoutCRDs(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		gpuProfiles: "GpuProfileList", tenantQuotas: "TenantQuotaList"})
	client.PrependReactor("list", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(action.GetResource().GroupResource(), "")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p := WatchPolicies(ctx, client, 10*time.Millisecond)
	<-ctx.Done()
	if got := p.Threshold("team-a", "h100"); got != 0 {
		t.Errorf("Threshold without CRDs = %d, want 0", got)
	}
}
