package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// kueueDashboardProfile is a GpuProfile a data scientist picks in the
// OpenShift AI dashboard: a time-sliced replica asked by its extended
// resource, with CPU and memory the test node can give.
var kueueDashboardProfile = gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: "e2e-kueue-dashboard"}, Spec: gpuaas.GpuProfileSpec{
	DisplayName:          "Notebook, a quarter GPU",
	Selector:             gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeTimeSlice},
	ExtendedResourceName: ptr.To("gpuaas.io/e2e-dashboard"),
	HardwareProfile: &gpuaas.HardwareProfileSettings{
		CPU:    &gpuaas.ResourceRange{Min: ptr.To(resource.MustParse("10m")), Default: ptr.To(resource.MustParse("10m")), Max: ptr.To(resource.MustParse("1"))},
		Memory: &gpuaas.ResourceRange{Min: ptr.To(resource.MustParse("16Mi")), Default: ptr.To(resource.MustParse("16Mi")), Max: ptr.To(resource.MustParse("1Gi"))},
	},
}}

// kueueDashboardPrice is the transformation of its extended resource, a
// replica of 4 (what the controller renders for it).
var kueueDashboardPrice = kueue.ExtendedPrice{ExtendedResource: "gpuaas.io/e2e-dashboard", Milliunits: 250}

// testKueueDashboard (issue 54 item 3): the dashboard's contract. A
// Kueue-managed tenant (spec.kueue) with a LocalQueue of its ClusterQueue
// gets the profile's HardwareProfile in its namespace, scheduled through
// that LocalQueue. The test then does what the dashboard's admission does
// to a workload that names the HardwareProfile: each identifier's
// defaultCount into the container's requests and limits, and the queue
// label. On the real node with the real Kueue the pod runs on a device of
// the profile's class, Kueue charged it 250 GPU milli-units (nothing under
// the extended resource's name), and the TenantQuota's status shows the
// same quarter GPU.
func testKueueDashboard(t *testing.T, kq *kueueHelper) {
	ctx := framework.Context(t, 5*time.Minute)
	installHardwareProfileCRD(t, ctx)
	p := kueueDashboardProfile.DeepCopy()
	createObject(t, p)
	waitForProfileReady(t, p.Name)

	ns := cp.CreateNamespace(t, "dashboard")
	kq.deleteJobsAtCleanup(ns)
	tenant, clusterQueue := uniqueName("dashboard"), uniqueName("dashboard-cq")
	// The LocalQueue first: the tenant's namespaces resolving is what
	// makes the controller look (LocalQueues it reads on the resync).
	kq.apply(ctx, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: notebooks, namespace: %s}
spec: {clusterQueue: %s}`, ns, clusterQueue))
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")})
	q.Spec.Kueue = &gpuaas.TenantKueue{ClusterQueue: clusterQueue}
	createObject(t, q)
	kq.waitNominal(ctx, clusterQueue, 1000)

	var hp *unstructured.Unstructured
	kq.poll(ctx, "the profile's HardwareProfile in the tenant's namespace, queued", func(ctx context.Context) (bool, error) {
		got, err := cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		queue, _, _ := unstructured.NestedString(got.Object, "spec", "scheduling", "kueue", "localQueueName")
		hp = got
		return queue == "notebooks", nil
	})
	waitForProfile(t, p.Name, "published in "+ns, func(p *gpuaas.GpuProfile) bool {
		for _, n := range p.Status.HardwareProfileNamespaces {
			if n == ns {
				return true
			}
		}
		return false
	})

	job, err := framework.DashboardJob(ns, "notebook", "registry.k8s.io/pause:3.10", hp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the dashboard's job: %v", err)
	}
	if got := kq.waitAdmitted(ctx, ns, "notebook"); got != 250 {
		t.Errorf("the dashboard's workload was charged %d GPU milli-units, want 250, a replica's", got)
	}
	wl, err := kq.workload(ctx, ns, "notebook")
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := framework.WorkloadCharge(wl, *p.Spec.ExtendedResourceName); ok && n != 0 {
		t.Errorf("also charged %d %s, outside the GPU units", n, *p.Spec.ExtendedResourceName)
	}
	kq.waitRunningPods(ctx, ns, "notebook", 1)

	pod := kq.jobPods(ctx, ns, "notebook")[0]
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatalf("pod %s has no extendedResourceClaimStatus: %s was not satisfied through DRA", pod.Name, *p.Spec.ExtendedResourceName)
	}
	claim, err := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := claim.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != p.Name {
		t.Errorf("the pod's claim asks %+v, want one device of the profile's class %s", reqs, p.Name)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("the pod's claim %s is not allocated one device: %+v", claim.Name, claim.Status.Allocation)
	}
	device := claim.Status.Allocation.Devices.Results[0]
	if got := deviceType(t, ctx, device.Pool, device.Device); got != string(gpuaas.DeviceTypeTimeSlice) {
		t.Errorf("the pod runs on %s/%s of type %q, want a %s replica as the profile selects", device.Pool, device.Device, got, gpuaas.DeviceTypeTimeSlice)
	}
	waitForQuota(t, tenant, "charged the quarter GPU Kueue charged", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "250m" })
}

// deviceType is the gpu.gpuaas.io type attribute of a published device.
func deviceType(t *testing.T, ctx context.Context, pool, device string) string {
	t.Helper()
	slices, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		if s.Spec.Pool.Name != pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				if a, ok := d.Attributes["type"]; ok && a.StringValue != nil {
					return *a.StringValue
				}
			}
		}
	}
	return ""
}
