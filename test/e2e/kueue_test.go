package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// kueueCharges are the catalog's classes, all charged in GPU milli-units,
// and the NIC class of kueueSlot, as the controller renders them.
var kueueCharges = append([]kueue.Charge{
	{DeviceClass: "gpu.gpuaas.io"}, {DeviceClass: "mig.gpuaas.io"},
	{DeviceClass: "mig-1g.10gb.gpuaas.io"}, {DeviceClass: "timeslice.gpuaas.io"},
}, kueue.ShapeCharges([]gpuaas.GpuShape{kueueSlot}, nil, nil)...)

// kueueNICClass is another driver's NICs, for kueueSlot.
const kueueNICClass = "e2e-kueue-nic"

// kueueSlot is a slot shape: a whole GPU of the catalog and a NIC of
// another driver on its PCIe root.
var kueueSlot = gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "kueue-slot"}, Spec: gpuaas.GpuShapeSpec{
	Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: "gpu.gpuaas.io"}, {Name: "nic", DeviceClassName: kueueNICClass}},
	Alignment: gpuaas.AlignPCIeRoot,
}}

// TestKueue runs the real Kueue manager (hack/build-kueue.sh) against the
// control plane, configured with the deviceClassMappings pkg/kueue renders,
// over one demo node (4 whole GPUs, a GPU time-sliced 4 ways, a shared GPU,
// 2 dynamic-MIG GPUs). Each subtest has its own queues and namespaces.
func TestKueue(t *testing.T) {
	startNode(t)
	ctx := framework.Context(t, 20*time.Minute)
	applySharingClasses(t, ctx)
	createObject(t, &kueueReplicaClass)
	resources := kueue.Resources(append(kueueCharges, kueue.Charge{DeviceClass: kueueReplicaClass.Name}, kueue.Charge{DeviceClass: kueueDashboardProfile.Name}),
		kueueReplicaPrice, kueueDashboardPrice)
	// The dashboard's workloads ask CPU and memory too, which the
	// ClusterQueues here (as those the controller keeps) do not cover.
	resources["excludeResourcePrefixes"] = []any{"cpu", "memory"}
	startKueueWithController(t, framework.KueueOptions{
		Resources: resources, FairSharing: true, FeatureGates: kueue.ExtendedResourceGate + "=false",
	}, func(o *controller.Options) { o.IdlePolicy, o.HardwareProfilesPerTenant = true, true })
	t.Run("GPUUnits", func(t *testing.T) { testKueueGPUUnits(t, &kueueHelper{t: t}) })
	t.Run("Gang", func(t *testing.T) { testKueueGang(t, &kueueHelper{t: t}) })
	t.Run("Priority", func(t *testing.T) { testKueuePriority(t, &kueueHelper{t: t}) })
	t.Run("Reclaim", func(t *testing.T) { testKueueReclaim(t, &kueueHelper{t: t}) })
	t.Run("FairShare", func(t *testing.T) { testKueueFairShare(t, &kueueHelper{t: t}) })
	t.Run("TenantQuota", func(t *testing.T) { testKueueTenantQuota(t, &kueueHelper{t: t}) })
	t.Run("BackedQueue", func(t *testing.T) { testKueueBackedQueue(t, &kueueHelper{t: t}) })
	t.Run("Shape", func(t *testing.T) { testKueueShape(t, &kueueHelper{t: t}) })
	t.Run("ExtendedResource", func(t *testing.T) { testKueueExtendedResource(t, &kueueHelper{t: t}) })
	t.Run("Dashboard", func(t *testing.T) { testKueueDashboard(t, &kueueHelper{t: t}) })
	t.Run("IdleDeactivate", func(t *testing.T) { testKueueIdleDeactivate(t, &kueueHelper{t: t}) })
	t.Run("IdleDeactivateMeasured", func(t *testing.T) { testKueueIdleDeactivateMeasured(t, &kueueHelper{t: t}) })
	t.Run("ControllerWorkloadFence", func(t *testing.T) { testKueueControllerWorkloadFence(t, &kueueHelper{t: t}) })
}

// kueueReplicaClass is a profile's class that pods may also ask as an
// extended resource (a time-slice replica of 4), and kueueReplicaPrice the
// transformation the controller renders for it (kueuemirror; the price of
// the class's devices, 250 milli-units, is the accountant's).
var (
	kueueReplicaClass = resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-kueue-replica"},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "timeslice"`}}},
			ExtendedResourceName: ptr.To("gpuaas.io/e2e-replica"),
		}}
	kueueReplicaPrice = kueue.ExtendedPrice{ExtendedResource: "gpuaas.io/e2e-replica", Milliunits: 250}
)

// testKueueExtendedResource (issue 54): a Job whose pod asks a profile's
// extended resource (as the OpenShift AI dashboard's hardware profiles ask
// GPUs: container requests and limits) under a LocalQueue whose
// ClusterQueue covers only GPU milli-units was held Pending ("resource
// gpuaas.io/shared-gpu unavailable in ClusterQueue"), or charged the
// extended resource itself, outside the units. With the transformation and
// KueueDRAIntegrationExtendedResource off, Kueue admits it charged 250
// milli-units, a replica's, the pod runs on a replica, and four of them
// fill one GPU unit: a fifth waits.
func testKueueExtendedResource(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 4*time.Minute)
	ns := kq.team("extended", "", 1000, nil)
	for i := range 5 {
		kq.extendedJob(ctx, ns, fmt.Sprintf("replica-%d", i), *kueueReplicaClass.Spec.ExtendedResourceName)
	}
	for i := range 4 {
		name := fmt.Sprintf("replica-%d", i)
		if got := kq.waitAdmitted(ctx, ns, name); got != 250 {
			t.Errorf("job %s asking %s: 1 was charged %d milli-units, want 250, a replica's", name, *kueueReplicaClass.Spec.ExtendedResourceName, got)
		}
		wl, err := kq.workload(ctx, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if n, ok := framework.WorkloadCharge(wl, *kueueReplicaClass.Spec.ExtendedResourceName); ok && n != 0 {
			t.Errorf("job %s was also charged %d %s, outside the GPU units", name, n, *kueueReplicaClass.Spec.ExtendedResourceName)
		}
		kq.waitRunningPods(ctx, ns, name, 1)
	}
	kq.staysPending(ctx, ns, "replica-4", 5*time.Second)
	if got := kq.usage(ctx, ns); got != 1000 {
		t.Errorf("ClusterQueue %s uses %d milli-units with four replicas admitted, want 1000", ns, got)
	}
}

// testKueueShape (issue 38 item 5): Kueue charges a job of the slot
// shape's template (a GPU and another driver's NIC) what the GPU alone
// costs, 1000 milli-units, the NIC class being mapped by count under a
// resource of its own. A whole-node lease (allocationMode All) Kueue
// v0.19.2 does not charge at all: it holds the workload as inadmissible,
// which docs/kueue.md says.
func testKueueShape(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 3*time.Minute)
	createObject(t, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: kueueNICClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", e2eNICDriver)}}}}})
	ns := kq.team("shape", "", 1000, nil)
	slot := shape.ClaimSpec(&kueueSlot)
	kq.job(ctx, ns, "slot", jobSpec{claim: &slot})
	if got := kq.waitAdmitted(ctx, ns, "slot"); got != 1000 {
		t.Errorf("a GPU+NIC slot was charged %d milli-units, want 1000, its GPU's", got)
	}
	lease := shape.ClaimSpec(&gpuaas.GpuShape{Spec: gpuaas.GpuShapeSpec{Requests: []gpuaas.ShapeRequest{
		{Name: "gpus", Profile: "gpu.gpuaas.io", AllocationMode: gpuaas.ShapeAll}}}})
	kq.job(ctx, ns, "lease", jobSpec{claim: &lease})
	kq.poll(ctx, "the lease's workload held as inadmissible", func(ctx context.Context) (bool, error) {
		wl, err := kq.workload(ctx, ns, "lease")
		if wl == nil || err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
		for _, c := range conds {
			if msg, _ := c.(map[string]any)["message"].(string); strings.Contains(msg, "AllocationMode 'All' is not supported") {
				t.Logf("Kueue on the whole-node lease: %s", msg)
				return true, nil
			}
		}
		return false, nil
	})
}

// testKueueGPUUnits: a ClusterQueue of one GPU unit (1000 milli-units)
// admits a whole GPU, then nothing else until it is gone; then seven 1g
// MIG slices (142 each, 1/7 rounded down) but not an eighth.
func testKueueGPUUnits(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	ns := kq.team("units", "", 1000, nil)
	kq.job(ctx, ns, "whole", jobSpec{class: "gpu.gpuaas.io"})
	if got := kq.waitAdmitted(ctx, ns, "whole"); got != 1000 {
		t.Errorf("a whole GPU was charged %d milli-units, want 1000", got)
	}
	kq.job(ctx, ns, "slice-0", jobSpec{class: "mig-1g.10gb.gpuaas.io"})
	kq.staysPending(ctx, ns, "slice-0", 5*time.Second)
	kq.deleteJob(ctx, ns, "whole")
	if got := kq.waitAdmitted(ctx, ns, "slice-0"); got != 142 {
		t.Errorf("a 1g.10gb slice was charged %d milli-units, want 142 (1/7 of a GPU, rounded down)", got)
	}
	for i := 1; i < 7; i++ {
		name := fmt.Sprintf("slice-%d", i)
		kq.job(ctx, ns, name, jobSpec{class: "mig-1g.10gb.gpuaas.io"})
		kq.waitAdmitted(ctx, ns, name)
	}
	kq.job(ctx, ns, "slice-7", jobSpec{class: "mig-1g.10gb.gpuaas.io"})
	kq.staysPending(ctx, ns, "slice-7", 5*time.Second)
	if used := kq.usage(ctx, kq.queue(ns)); used != 7*142 {
		t.Errorf("ClusterQueue usage %d, want %d for seven 1g slices", used, 7*142)
	}
	// The scheduler puts all seven on the MIG GPUs: Kueue's charge and the
	// devices agree.
	for i := range 7 {
		kq.waitRunningPods(ctx, ns, fmt.Sprintf("slice-%d", i), 1)
	}
}

// testKueueGang: a Job of four one-GPU pods against room for three is
// admitted whole or not at all: none of its pods exist until the quota
// grows to four, then all four run.
func testKueueGang(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	ns := kq.team("gang", "", 3000, nil)
	kq.job(ctx, ns, "four", jobSpec{class: "gpu.gpuaas.io", pods: 4})
	kq.job(ctx, ns, "three", jobSpec{class: "gpu.gpuaas.io", pods: 3})
	if got := kq.waitAdmitted(ctx, ns, "three"); got != 3000 {
		t.Errorf("a job of three whole GPUs was charged %d, want 3000", got)
	}
	kq.staysPending(ctx, ns, "four", 5*time.Second)
	if n := len(kq.jobPods(ctx, ns, "four")); n != 0 {
		t.Fatalf("the job of four that does not fit has %d pods, want none", n)
	}
	kq.deleteJob(ctx, ns, "three")
	kq.setQuota(ctx, kq.queue(ns), 4000)
	kq.waitAdmitted(ctx, ns, "four")
	kq.waitRunningPods(ctx, ns, "four", 4)
}

// testKueuePriority: two jobs wait behind a running one; when it ends, the
// one of higher priority is admitted first although it came second.
func testKueuePriority(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	kq.priorityClass("gpuaas-e2e-low", 100)
	kq.priorityClass("gpuaas-e2e-high", 1000)
	ns := kq.team("priority", "", 1000, nil)
	kq.job(ctx, ns, "running", jobSpec{class: "gpu.gpuaas.io"})
	kq.waitAdmitted(ctx, ns, "running")
	kq.job(ctx, ns, "low", jobSpec{class: "gpu.gpuaas.io", priority: "gpuaas-e2e-low"})
	time.Sleep(time.Second) // "low" is older
	kq.job(ctx, ns, "high", jobSpec{class: "gpu.gpuaas.io", priority: "gpuaas-e2e-high"})
	kq.staysPending(ctx, ns, "high", 3*time.Second)
	kq.deleteJob(ctx, ns, "running")
	kq.waitAdmitted(ctx, ns, "high")
	kq.staysPending(ctx, ns, "low", 5*time.Second)
	kq.deleteJob(ctx, ns, "high")
	kq.waitAdmitted(ctx, ns, "low")
}

// testKueueReclaim: team B borrows team A's idle GPUs; when A submits, Kueue
// preempts B's borrowed workloads and A's pods run on the GPUs they held.
func testKueueReclaim(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 6*time.Minute)
	cohort := kq.unique("reclaim")
	preempt := map[string]any{"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}
	nsA := kq.team("reclaim-a", cohort, 2000, preempt)
	nsB := kq.team("reclaim-b", cohort, 2000, preempt)
	kq.waitAllAdmitted(ctx, nsB, kq.gpuJobs(ctx, nsB, "b", 4))
	for _, job := range kq.gpuJobs(ctx, nsA, "a", 2) {
		kq.waitAdmitted(ctx, nsA, job)
		kq.waitRunningPods(ctx, nsA, job, 1)
	}
	// ClusterQueue status is written apart from admission: wait for it.
	shares := kq.waitShares(ctx, kq.queue(nsA), kq.queue(nsB), 2000, 2000)
	t.Logf("usage after team A submitted (seconds: A/B milli-units): %s", shares)
	if n := kq.pendingWorkloads(ctx, nsB); n != 2 {
		t.Errorf("%d of team B's workloads wait after the reclaim, want the 2 preempted", n)
	}
}

// testKueueFairShare: two teams with no quota of their own share a cohort
// of four GPUs. Team A takes all four first; once team B queues work, fair
// sharing preempts A until both hold two.
func testKueueFairShare(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 6*time.Minute)
	cohort := kq.unique("fair")
	kq.apply(ctx, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: Cohort
metadata: {name: %s}
spec:
  resourceGroups:
  - coveredResources: [%q]
    flavors:
    - name: gpuaas
      resources:
      - {name: %q, nominalQuota: "4000"}`, cohort, kueue.DefaultResource, kueue.DefaultResource))
	kq.deleteAtCleanup("cohorts", cohort)
	preempt := map[string]any{"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}
	nsA := kq.team("fair-a", cohort, 0, preempt)
	nsB := kq.team("fair-b", cohort, 0, preempt)
	kq.waitAllAdmitted(ctx, nsA, kq.gpuJobs(ctx, nsA, "a", 4))
	start := time.Now()
	kq.gpuJobs(ctx, nsB, "b", 4)
	shares := kq.waitShares(ctx, kq.queue(nsA), kq.queue(nsB), 2000, 2000)
	t.Logf("fair share over time after team B queued (seconds: A/B milli-units): %s (converged in %.1fs)",
		shares, time.Since(start).Seconds())
}

// testKueueTenantQuota: the dra-controller runs with --kueue, and the team's
// TenantQuota allows one GPU unit while its ClusterQueue allows two. A Job
// of two whole GPUs that Kueue admits runs whole: the claim over the
// TenantQuota is admitted (and charged) because Kueue admitted its
// workload. A bare pod of the same namespace, which bypasses Kueue, is
// still refused by the TenantQuota.
func testKueueTenantQuota(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	ns := kq.team("tenant", "", 2000, nil)
	tenant := uniqueName("kueue-tenant")
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")}))
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })
	kq.job(ctx, ns, "pair", jobSpec{class: "gpu.gpuaas.io", pods: 2})
	kq.waitAdmitted(ctx, ns, "pair")
	kq.waitRunningPods(ctx, ns, "pair", 2)
	waitForQuota(t, tenant, "charged both GPUs", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "2" })
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "bypass", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io"}}},
		}}},
	}
	createTemplatePod(t, ctx, tmpl)
	if _, err := cp.WaitForEvent(ctx, ns, "Pod", "bypass", "QuotaExceeded", "gpuUnits: used 2", "limit 1"); err != nil {
		t.Fatalf("a pod that bypasses Kueue was not refused by the TenantQuota: %v", err)
	}
}

// testKueueBackedQueue: a TenantQuota with spec.kueue has the controller
// keep a ClusterQueue that mirrors it (1.5 GPU units = 1500 milli-units);
// a job queued there is admitted, and a new limit reaches the queue.
func testKueueBackedQueue(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	ns := cp.CreateNamespace(t, "backed")
	kq.deleteJobsAtCleanup(ns)
	tenant, queue := uniqueName("backed"), uniqueName("backed-gpus")
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1.5")})
	q.Spec.Kueue = &gpuaas.TenantKueue{ClusterQueue: queue}
	createObject(t, q)
	kq.waitNominal(ctx, queue, 1500)
	kq.apply(ctx, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: queue, namespace: %s}
spec: {clusterQueue: %s}`, ns, queue))
	kq.job(ctx, ns, "slice", jobSpec{class: "mig-1g.10gb.gpuaas.io"})
	if got := kq.waitAdmitted(ctx, ns, "slice"); got != 142 {
		t.Errorf("a 1g slice was charged %d in the mirrored queue, want 142", got)
	}
	updateObject(t, ctx, q, func(q *gpuaas.TenantQuota) { q.Spec.Limits.GpuUnits = units("2") })
	kq.waitNominal(ctx, queue, 2000)
}

// waitForFlavor waits for the ResourceFlavor the controller creates once
// Kueue's CRDs exist (it retries on its resync).
func waitForFlavor(t *testing.T) {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Dynamic.Resource(framework.KueueResource("resourceflavors")).Get(ctx, kueue.Flavor, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the dra-controller did not create ResourceFlavor %s: %v", kueue.Flavor, err)
	}
}
