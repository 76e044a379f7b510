package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/hack/nvmlshim/shimbuild"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// measuredBusySM is the SM utilization of the busy Job's GPU.
const measuredBusySM = 60

// testKueueIdleDeactivateMeasured is IdleDeactivate with the evidence
// measured, not written by the test: a node of its own whose plugin samples
// through the simulated libnvidia-ml.so.1 (the production NVML path) and
// renews its use Lease in the controller's namespace (POD_NAMESPACE, as the
// chart sets it). Its whole GPUs run at 60% on the simulated machine but
// the one the idle Job holds, set to 0%. Under a tenant policy of 5% for
// 1m with Deactivate, the plugin's own Idle condition and Lease make the
// controller deactivate the idle Job's Workload (its event names the policy
// and the use measured), which frees its claim, while the busy Job's stays
// active; reactivated, the idle Job runs again.
func testKueueIdleDeactivateMeasured(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 6*time.Minute)
	lib, _, err := shimbuild.Library(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	name := nodeName(t)
	pin := map[string]string{"e2e.gpuaas.io/use-node": name}
	node := startNodeWith(t, framework.NodeOptions{Name: name, NodeConfig: filepath.Join(repoRoot, "demo", "node-config.yaml"),
		Labels: pin, NVMLLibrary: lib, Env: []string{"POD_NAMESPACE=default"}})
	m := node.Machine()
	for i := range int64(4) { // the demo node's whole GPUs
		if err := m.SetGPUUse(gpuUUIDOf(t, ctx, name, i), nvmock.GPUUse{SMUtil: measuredBusySM}); err != nil {
			t.Fatal(err)
		}
	}

	ns := kq.team("idle-measured", "", 2000, nil) // two whole GPUs

	tenant := uniqueName("kueue-idle-measured")
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("2")})
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{ThresholdPercent: 5, Duration: metav1.Duration{Duration: time.Minute}, Action: gpuaas.IdleActionDeactivate}
	createObject(t, q)
	waitForQuotaNamespace(t, tenant, ns)
	// On the GPUs set busy above, not a dynamic-MIG GPU's whole device.
	wholeGPU := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io",
			Selectors: celSelectors(`device.attributes["gpu.gpuaas.io"].type == "gpu" && device.attributes["gpu.gpuaas.io"].index < 4`)}}}}}
	pods := map[string]string{}
	for _, job := range []string{"notebook", "trainer"} {
		kq.job(ctx, ns, job, jobSpec{class: "gpu.gpuaas.io", claim: &wholeGPU, nodeSelector: pin})
		kq.waitAdmitted(ctx, ns, job)
		kq.waitRunningPods(ctx, ns, job, 1)
		pods[job] = kq.jobPods(ctx, ns, job)[0].Name
	}
	notebook := kq.jobPods(ctx, ns, "notebook")[0]
	claimName := podClaimName(t, &notebook)
	_, data := deviceStatus(t, ctx, ns, claimName, "Ready with the GPU's UUID", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, "Ready", metav1.ConditionTrue)
	})
	if err := m.SetGPUUse(data.GPUUUID, nvmock.GPUUse{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the notebook's GPU %s runs at 0%%, the node's other whole GPUs at %d%%", data.GPUUUID, measuredBusySM)

	if _, err := cp.WaitForEvent(ctx, ns, "Pod", pods["notebook"], "IdleDeactivated", "policy tenantquota/"+tenant, "SM utilization at most 0%"); err != nil {
		t.Fatal(err)
	}
	wl, err := kq.workload(ctx, ns, "notebook")
	if err != nil || wl == nil {
		t.Fatalf("the notebook Job's Workload: %v", err)
	}
	if active, found, _ := unstructured.NestedBool(wl.Object, "spec", "active"); !found || active {
		t.Fatalf("Workload %s spec.active = %v (set: %v), want false", wl.GetName(), active, found)
	}
	claims := cp.Client.ResourceV1().ResourceClaims(ns)
	kq.poll(ctx, "the idle Job's claim gone (its GPU freed)", func(ctx context.Context) (bool, error) {
		_, err := claims.Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	trainer, err := kq.workload(ctx, ns, "trainer")
	if err != nil || trainer == nil {
		t.Fatalf("the trainer Job's Workload: %v", err)
	}
	if active, found, _ := unstructured.NestedBool(trainer.Object, "spec", "active"); found && !active {
		t.Errorf("the busy trainer's Workload %s was deactivated", trainer.GetName())
	}

	_, err = cp.Dynamic.Resource(framework.KueueResource("workloads")).Namespace(ns).Patch(ctx, wl.GetName(),
		types.MergePatchType, []byte(`{"spec":{"active":true}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("reactivating Workload %s: %v", wl.GetName(), err)
	}
	kq.waitAdmitted(ctx, ns, "notebook")
	kq.waitRunningPods(ctx, ns, "notebook", 1)
}
