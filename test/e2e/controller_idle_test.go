package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	metaapply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestControllerIdlePolicyEvictsTheIdlePod, against the real API server:
// two claims on one node, each reserved for its pod; the test writes, as
// the node's plugin would, the claims' Idle device conditions (the notebook
// idle for two minutes, the trainer in use) and the node's use Lease. With
// a tenant policy of 5% for 1m and Evict, the notebook's pod is evicted
// through the Eviction API with an event naming the policy, and the
// trainer's pod stays.
func TestControllerIdlePolicyEvictsTheIdlePod(t *testing.T) {
	rc := startControllerWith(t, func(o *controller.Options) { o.IdlePolicy = true })
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("idle")
	node := name + "-node"
	product := "E2E Idle GPU " + name
	createObject(t, profile(name, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: product}))
	waitForProfileReady(t, name)
	createObject(t, e2eSlice(name+"-gpus", "gpu.gpuaas.io", node,
		[]resourceapi.Device{e2eShapeGPU("gpu-0", product, "pci0000:00"), e2eShapeGPU("gpu-1", product, "pci0000:00")}))
	ns := cp.CreateNamespace(t, "idle")
	q := quotaFor(name, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("2")})
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{ThresholdPercent: 5, Duration: metav1.Duration{Duration: time.Minute}, Action: gpuaas.IdleActionEvict}
	createObject(t, q)
	waitForQuotaNamespace(t, name, ns)

	now := time.Now()
	createObject(t, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: gpuaas.UseLeasePrefix + node},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("plugin-" + node), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &metav1.MicroTime{Time: now.Add(-time.Hour)}, RenewTime: &metav1.MicroTime{Time: now}},
	})
	notebook := claimInUse(t, ctx, ns, "notebook", name, node, "gpu-0",
		metav1.Condition{Type: gpuaas.DeviceConditionIdle, Status: metav1.ConditionTrue, Reason: gpuaas.ReasonIdleBelowThreshold,
			Message: "SM 0% (threshold 5%)", LastTransitionTime: metav1.NewTime(now.Add(-2 * time.Minute))})
	trainer := claimInUse(t, ctx, ns, "trainer", name, node, "gpu-1",
		metav1.Condition{Type: gpuaas.DeviceConditionIdle, Status: metav1.ConditionFalse, Reason: gpuaas.ReasonIdleInUse,
			Message: "SM 70% (threshold 5%)", LastTransitionTime: metav1.NewTime(now.Add(-2 * time.Minute))})

	pods := cp.Client.CoreV1().Pods(ns)
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, notebook.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the idle notebook's pod was not evicted: %v", err)
	}
	_, err = cp.WaitForEvent(ctx, ns, "Pod", notebook.Name, "IdleEvicted",
		"policy tenantquota/"+name, "below 5% for 1m0s", "SM 0% (threshold 5%)", "pod evicted")
	if err != nil {
		t.Error(err)
	}
	if p, err := pods.Get(ctx, trainer.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil || p.UID != trainer.UID {
		t.Errorf("the busy trainer's pod: %v (deleting: %v); want it kept", err, p != nil && p.DeletionTimestamp != nil)
	}
	rc.alive(t)
}

// claimInUse makes a claim of one device of class on node and a pod using
// it, and writes what the scheduler and the node's plugin would: the
// allocation, the pod's reservation and the device's Idle condition. It
// returns the pod.
func claimInUse(t *testing.T, ctx context.Context, ns, name, class, node, device string, idle metav1.Condition) *corev1.Pod {
	t.Helper()
	if err := createClaim(ctx, gpuClaim(ns, name, class, 1)); err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	pod, err := cp.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			// Never scheduled: no node of this test runs pods.
			NodeSelector:   map[string]string{"kubernetes.io/hostname": node},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	claims := cp.Client.ResourceV1().ResourceClaims(ns)
	onConflictRetry(t, "writing claim "+name+"'s status", func() error {
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.gpuaas.io", Pool: node, Device: device}},
		}}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
		c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.gpuaas.io", Pool: node, Device: device,
			Conditions: []metav1.Condition{idle}}}
		_, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
	return pod
}

// waitForQuotaNamespace waits until the TenantQuota has resolved ns.
func waitForQuotaNamespace(t *testing.T, quota, ns string) {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var q gpuaas.TenantQuota
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: quota}, &q); err != nil {
			return false, nil
		}
		return slices.Contains(q.Status.Namespaces, ns), nil
	})
	if err != nil {
		t.Fatalf("TenantQuota %s never resolved namespace %s: %v", quota, ns, err)
	}
}

// testKueueIdleDeactivate (issue 56): a Job's pod runs on the node with its
// GPU; the test writes, as the node's plugin would, the claim's Idle
// condition (idle for two minutes) and the node's use Lease. With a tenant
// policy of Deactivate after 1m, the Job's Workload gets spec.active=false
// with an event naming the policy, Kueue evicts it and its claim goes (the
// GPU is freed); reactivated by a person, the Job runs again.
func testKueueIdleDeactivate(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	ns := kq.team("idle", "", 1000, nil)
	tenant := uniqueName("kueue-idle")
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")})
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{Duration: metav1.Duration{Duration: time.Minute}, Action: gpuaas.IdleActionDeactivate}
	createObject(t, q)
	waitForQuotaNamespace(t, tenant, ns)
	kq.job(ctx, ns, "notebook", jobSpec{class: "gpu.gpuaas.io"})
	kq.waitAdmitted(ctx, ns, "notebook")
	kq.waitRunningPods(ctx, ns, "notebook", 1)
	pod := kq.jobPods(ctx, ns, "notebook")[0]
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s has no claim: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	claims := cp.Client.ResourceV1().ResourceClaims(ns)
	claim, err := claims.Get(ctx, claimName, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s of the running pod: %v, allocation %+v", claimName, err, claim.Status.Allocation)
	}
	d := claim.Status.Allocation.Devices.Results[0]
	now := time.Now()
	writeUseLease(t, d.Pool, now.Add(-time.Hour))
	applyIdle(t, ctx, claim, d, metav1.NewTime(now.Add(-2*time.Minute)))

	if _, err := cp.WaitForEvent(ctx, ns, "Pod", pod.Name, "IdleDeactivated", "policy tenantquota/"+tenant, "SM 0%"); err != nil {
		t.Fatal(err)
	}
	wl, err := kq.workload(ctx, ns, "notebook")
	if err != nil || wl == nil {
		t.Fatalf("the Job's Workload: %v", err)
	}
	if active, found, _ := unstructured.NestedBool(wl.Object, "spec", "active"); !found || active {
		t.Fatalf("Workload %s spec.active = %v (set: %v), want false", wl.GetName(), active, found)
	}
	kq.poll(ctx, "the idle Job's claim gone (its GPU freed)", func(ctx context.Context) (bool, error) {
		_, err := claims.Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// A person reactivates it: it runs again, on a claim of its own that
	// no sample has called idle.
	_, err = cp.Dynamic.Resource(framework.KueueResource("workloads")).Namespace(ns).Patch(ctx, wl.GetName(),
		types.MergePatchType, []byte(`{"spec":{"active":true}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("reactivating Workload %s: %v", wl.GetName(), err)
	}
	kq.waitAdmitted(ctx, ns, "notebook")
	kq.waitRunningPods(ctx, ns, "notebook", 1)
}

// writeUseLease creates or renews node's use Lease as the node's plugin
// does, acquired at start.
func writeUseLease(t *testing.T, node string, start time.Time) {
	t.Helper()
	ctx := framework.Context(t, 30*time.Second)
	leases := cp.Client.CoordinationV1().Leases("default")
	name := gpuaas.UseLeasePrefix + node
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To("plugin-" + node), LeaseDurationSeconds: ptr.To[int32](3600),
		AcquireTime: &metav1.MicroTime{Time: start}, RenewTime: &metav1.MicroTime{Time: time.Now()}}
	onConflictRetry(t, "writing Lease "+name, func() error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		l.Spec = spec
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	deleteAtCleanup(t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}})
}

// applyIdle writes device d's Idle condition into the claim's status with
// a field manager of its own, beside the conditions the plugin owns.
func applyIdle(t *testing.T, ctx context.Context, claim *resourceapi.ResourceClaim, d resourceapi.DeviceRequestAllocationResult, since metav1.Time) {
	t.Helper()
	cfg := resourceapply.ResourceClaim(claim.Name, claim.Namespace).WithStatus(resourceapply.ResourceClaimStatus().WithDevices(
		resourceapply.AllocatedDeviceStatus().WithDriver(d.Driver).WithPool(d.Pool).WithDevice(d.Device).WithConditions(
			metaapply.Condition().WithType(gpuaas.DeviceConditionIdle).WithStatus(metav1.ConditionTrue).
				WithReason(gpuaas.ReasonIdleBelowThreshold).WithMessage("SM 0% (threshold 0%)").WithLastTransitionTime(since))))
	_, err := cp.Client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, cfg,
		metav1.ApplyOptions{FieldManager: "e2e-idle-sampler", Force: true})
	if err != nil {
		t.Fatalf("writing the Idle condition of claim %s: %v", claim.Name, err)
	}
}
