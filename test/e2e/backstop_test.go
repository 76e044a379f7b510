package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// Issue 26, the backstop: a TenantQuota's device limits are enforced by
// the API server's own ResourceQuota admission too, so that with the quota
// webhook gone (its configuration deleted, a bug) the tenant, acting as
// itself, still cannot take more devices of a profile than its limit, and
// cannot lift the ResourceQuota. The controller keeps one per namespace of
// the quota and deletes it from a namespace that leaves the quota.
func TestQuotaBackstopHoldsWithoutTheWebhook(t *testing.T) {
	rc := startControllerWith(t, func(o *controller.Options) { o.QuotaBackstop = true })
	ctx := framework.Context(t, 3*time.Minute)
	ns, other := cp.CreateNamespace(t, "backstop"), cp.CreateNamespace(t, "backstop-other")
	const class = "backstop-gpu"
	q := quotaFor(uniqueName("backstop"), []string{ns, other}, gpuaas.QuotaLimits{Devices: map[string]int64{class: 1}})
	createObject(t, q)
	resource := v1.ResourceName(class + ".deviceclass.resource.k8s.io/devices")
	for _, n := range []string{ns, other} {
		waitForBackstop(t, ctx, n, func(rq *v1.ResourceQuota) bool {
			// Enforced once the kube-controller-manager counted it.
			hard, synced := rq.Spec.Hard[resource], rq.Status.Hard[resource]
			return hard.Value() == 1 && synced.Value() == 1
		})
	}

	// The namespace leaves the quota: its backstop goes.
	updateObject(t, ctx, q, func(q *gpuaas.TenantQuota) { q.Spec.Namespaces = []string{ns} })
	waitForBackstop(t, ctx, other, nil)

	rc.stop(t) // the webhook configuration goes with it
	tenant, err := cp.NewTenant(ctx, ns, "team")
	if err != nil {
		t.Fatal(err)
	}
	claims := tenant.Client.ResourceV1().ResourceClaims(ns)
	if _, err := claims.Create(ctx, gpuClaim(ns, "first", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the first device, within the limit: %v", err)
	}
	_, err = claims.Create(ctx, gpuClaim(ns, "second", class, 1), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a second device of %s with no webhook: %v, want the API server's quota to refuse it", class, err)
	}
	t.Logf("refused by the API server: %v", err)
	err = tenant.Client.CoreV1().ResourceQuotas(ns).Delete(ctx, "gpuaas-backstop", metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the tenant deleting its backstop: %v, want forbidden", err)
	}
}

// Issue 36, route 6: a ResourceQuota counts devices under the class a
// claim names, so a class that selects a limited profile's devices without
// being named in the limits (here a catch-all over every device of ours) was
// a way past the backstop: with the webhook gone, the tenant got as many
// GPUs through it as it liked. Now every class that reaches a limited
// profile's published devices gets a line of its own, at the sum of the
// limits it reaches.
func TestQuotaBackstopHoldsThroughAnotherClass(t *testing.T) {
	fakeGPUNode(t, wholeDevice("gpu-0"), wholeDevice("gpu-1"), wholeDevice("gpu-2"))
	rc := startControllerWith(t, func(o *controller.Options) { o.QuotaBackstop = true })
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "backstop-other-class")
	limited, catchAll := uniqueName("bs-h100"), uniqueName("bs-any-gpu")
	createObject(t, profile(limited, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfileReady(t, limited)
	createObject(t, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: catchAll},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.gpuaas.io"`}}}}})
	createObject(t, quotaFor(uniqueName("backstop"), []string{ns}, gpuaas.QuotaLimits{Devices: map[string]int64{limited: 1}}))
	line := v1.ResourceName(catchAll + ".deviceclass.resource.k8s.io/devices")
	waitForBackstop(t, ctx, ns, func(rq *v1.ResourceQuota) bool {
		hard, synced := rq.Spec.Hard[line], rq.Status.Hard[line]
		return hard.Value() == 1 && synced.Value() == 1
	})

	rc.stop(t) // the webhook configuration goes with it
	tenant, err := cp.NewTenant(ctx, ns, "team")
	if err != nil {
		t.Fatal(err)
	}
	claims := tenant.Client.ResourceV1().ResourceClaims(ns)
	if _, err := claims.Create(ctx, gpuClaim(ns, "first", catchAll, 1), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the first device through %s, within the limit of %s: %v", catchAll, limited, err)
	}
	_, err = claims.Create(ctx, gpuClaim(ns, "second", catchAll, 1), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a second device through %s (it selects %s's devices) with no webhook: %v, want the API server's quota to refuse it", catchAll, limited, err)
	}
	t.Logf("refused by the API server: %v", err)
}

// waitForBackstop waits until the namespace's backstop ResourceQuota
// satisfies ok, or (ok nil) is gone.
func waitForBackstop(t *testing.T, ctx context.Context, ns string, ok func(*v1.ResourceQuota) bool) {
	t.Helper()
	var last string
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		rq, err := cp.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "gpuaas-backstop", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			last = "none"
			return ok == nil, nil
		case err != nil:
			return false, err
		}
		last = fmt.Sprintf("spec %v, status %v", rq.Spec.Hard, rq.Status.Hard)
		return ok != nil && ok(rq), nil
	})
	if err != nil {
		t.Fatalf("backstop ResourceQuota of namespace %s (last: %s): %v", ns, last, err)
	}
}
