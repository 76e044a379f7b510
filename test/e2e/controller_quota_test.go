package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

func units(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

// TestControllerQuotaDenialAndRetry: a tenant at its limit gets a denial
// that names the limit, both for a claim created directly and for a pod's
// template claim (the pod is told in an event and waits); deleting the
// running pod frees the quota, and the waiting pod's claim is then created
// and the pod runs, without waiting out the kube-controller-manager's
// back-off.
func TestControllerQuotaDenialAndRetry(t *testing.T) {
	startNode(t)
	rc := startController(t)
	ctx := framework.Context(t, 4*time.Minute)
	ns := cp.CreateNamespace(t, "quota")
	class, tenant := uniqueName("h100"), uniqueName("tenant")
	createObject(t, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: "NVIDIA H100 80GB HBM3"}))
	waitForProfile(t, class, "matching the node's whole GPUs", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices > 0 })
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")}))
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: gpuClaim(ns, "", class, 1).Spec}}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "first", "", "one-gpu"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, ns, "first")
	waitForQuota(t, tenant, "charged 1 unit", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "1" })

	err := createClaim(ctx, gpuClaim(ns, "direct", class, 1))
	mustDeny(t, err, `TenantQuota "`+tenant+`" exceeded`, "gpuUnits: used 1, reserved 0, requested 1, limit 1")

	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "second", "", "one-gpu"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.WaitForEvent(ctx, ns, "Pod", "second", "QuotaExceeded", "waiting for quota", "limit 1"); err != nil {
		t.Fatal(err)
	}
	if p, _ := cp.Client.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{}); p.Spec.NodeName != "" || len(p.Status.ResourceClaimStatuses) != 0 {
		t.Fatalf("pod second got a claim or a node past the quota: %+v", p.Status)
	}
	// Let the kube-controller-manager's back-off grow a little before the
	// quota frees up: the nudge, not a lucky retry, must start the pod.
	time.Sleep(3 * time.Second)

	freed := time.Now()
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, ns, "second")
	t.Logf("waiting pod ran %.1fs after the quota was freed", time.Since(freed).Seconds())
	// The nudge lands nudgeDelay after the deletion; on a loaded machine
	// the pod may be running by then (a back-off retry of the
	// kube-controller-manager's won the race): nudged all the same.
	var seen map[string]string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		seen = p.Annotations
		return p.Annotations[gpuaas.QuotaRetryAnnotation] != "", nil
	})
	if err != nil {
		t.Errorf("pod second was not nudged (annotation %s missing; annotations %v): %v", gpuaas.QuotaRetryAnnotation, seen, err)
	}
	q := waitForQuota(t, tenant, "charging the second pod", func(q *gpuaas.TenantQuota) bool {
		return usedUnits(q) == "1" && q.Status.ClaimsCounted == 1
	})
	if q.Status.Used.Devices[class] != 1 {
		t.Errorf("status.used.devices = %v", q.Status.Used.Devices)
	}
	rc.alive(t)
}

// TestControllerCohortBorrowing: a tenant borrows its cohort peer's idle
// quota up to its borrowing limit; the lending peer gets its own quota back
// only as the borrower gives it back (the cohort never holds more than the
// sum of its limits); once the peer uses it, there is nothing left to borrow.
// Claims here are never allocated (no node), so they are charged their
// worst case: a whole GPU each.
func TestControllerCohortBorrowing(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	nsA, nsB := cp.CreateNamespace(t, "team-a"), cp.CreateNamespace(t, "team-b")
	class, a, b, cohort := uniqueName("gpu"), uniqueName("team-a"), uniqueName("team-b"), uniqueName("cohort")
	createObject(t, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	qa := quotaFor(a, []string{nsA}, gpuaas.QuotaLimits{GpuUnits: units("1")})
	qa.Spec.Cohort, qa.Spec.BorrowingLimit = cohort, &gpuaas.BorrowingLimit{GpuUnits: units("1")}
	qb := quotaFor(b, []string{nsB}, gpuaas.QuotaLimits{GpuUnits: units("2")})
	qb.Spec.Cohort = cohort
	createObject(t, qa)
	createObject(t, qb)
	waitForQuota(t, b, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	for _, name := range []string{"a1", "a2"} { // a2 borrows from team-b
		if err := createClaim(ctx, gpuClaim(nsA, name, class, 1)); err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
	}
	waitForQuota(t, a, "borrowing 1", func(q *gpuaas.TenantQuota) bool {
		return q.Status.Borrowed.GpuUnits != nil && q.Status.Borrowed.GpuUnits.String() == "1"
	})
	mustDeny(t, createClaim(ctx, gpuClaim(nsA, "a3", class, 1)),
		"gpuUnits: used 0, reserved 2, requested 1, limit 1", `borrowing 2 from cohort "`+cohort+`" would exceed the borrowing limit 1`)

	// team-b lent one of its 2 units: its first claim fits, its second
	// waits for the loan (the cohort never holds more than its limits, 3).
	if err := createClaim(ctx, gpuClaim(nsB, "b1", class, 1)); err != nil {
		t.Fatalf("team-b claim b1 within its own quota: %v", err)
	}
	mustDeny(t, createClaim(ctx, gpuClaim(nsB, "b2", class, 1)),
		`within its own limit, but cohort "`+cohort+`" has lent it out: 0 idle`)
	if err := cp.Client.ResourceV1().ResourceClaims(nsA).Delete(ctx, "a2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForClaimGone(ctx, nsA, "a2"); err != nil {
		t.Fatal(err)
	}
	if err := createClaim(ctx, gpuClaim(nsB, "b2", class, 1)); err != nil {
		t.Fatalf("team-b taking back the unit team-a gave back: %v", err)
	}
	mustDeny(t, createClaim(ctx, gpuClaim(nsA, "a4", class, 1)), `cohort "`+cohort+`" has 0 idle to lend, 1 needed`)

	if err := cp.Client.ResourceV1().ResourceClaims(nsB).Delete(ctx, "b2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForClaimGone(ctx, nsB, "b2"); err != nil {
		t.Fatal(err)
	}
	if err := createClaim(ctx, gpuClaim(nsA, "a5", class, 1)); err != nil {
		t.Fatalf("borrowing the quota team-b gave back: %v", err)
	}
	rc.alive(t)
}

// MIG devices as the plugin will publish them (hand-written here).
func migDevice(name, profile string, slices int64, memory string) resourceapi.Device {
	return resourceapi.Device{
		Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To("mig")}, "profile": {StringValue: ptr.To(profile)},
			"productName":   {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
			"computeSlices": {IntValue: ptr.To(slices)}, "totalComputeSlices": {IntValue: ptr.To[int64](7)},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(memory)}},
	}
}

func wholeDevice(name string) resourceapi.Device {
	return resourceapi.Device{
		Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To("gpu")}, "productName": {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
	}
}

// TestControllerMIGWeights: after allocation a tenant is charged what its
// devices are worth (1g = 1/7, 3g = 3/7, whole = 1), exactly: seven
// sevenths fill a limit of 1 and an eighth is refused. Usage survives a
// controller restart, being rebuilt from the claims' allocations.
func TestControllerMIGWeights(t *testing.T) {
	devices := []resourceapi.Device{wholeDevice("gpu-0"), migDevice("gpu-1-mig-3g-0", "3g.40gb", 3, "40Gi")}
	for i := range 7 {
		devices = append(devices, migDevice(fmt.Sprintf("gpu-2-mig-1g-%d", i), "1g.10gb", 1, "10Gi"))
	}
	node := fakeGPUNode(t, devices...)
	rc := startController(t)
	ctx := framework.Context(t, 4*time.Minute)
	ns := cp.CreateNamespace(t, "mig")
	mig1g, mig3g, whole, tenant := uniqueName("mig-1g"), uniqueName("mig-3g"), uniqueName("whole"), uniqueName("tenant")
	createObject(t, profile(mig1g, gpuaas.ProfileSelector{MigProfile: "1g.10gb"}))
	createObject(t, profile(mig3g, gpuaas.ProfileSelector{MigProfile: "3g.40gb"}))
	createObject(t, profile(whole, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")}))
	waitForProfile(t, mig1g, "matching 7 slices", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices == 7 })
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	allocate := func(name, class string, count int64) {
		t.Helper()
		if err := createClaim(ctx, gpuClaim(ns, name, class, count)); err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, claimPod(ns, name, name, ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c := waitForAllocation(t, ctx, ns, name)
		if r := c.Status.Allocation.Devices.Results; len(r) != int(count) || r[0].Pool != node {
			t.Fatalf("claim %s allocated %+v", name, r)
		}
	}
	allocate("two-1g", mig1g, 2)
	allocate("one-3g", mig3g, 1)
	waitForQuota(t, tenant, "charged 2/7+3/7", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "715m" })
	mustDeny(t, createClaim(ctx, gpuClaim(ns, "whole", whole, 1)),
		"gpuUnits: used 5/7 (~0.714), reserved 0, requested 1, limit 1")

	allocate("more-1g", mig1g, 2)
	q := waitForQuota(t, tenant, "full at exactly 1", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "1" })
	if q.Status.Used.Devices[mig1g] != 4 || q.Status.Used.Devices[mig3g] != 1 || q.Status.Used.GpuMemory.String() != "80Gi" {
		t.Errorf("status.used = %+v", q.Status.Used)
	}
	eighth := "gpuUnits: used 1, reserved 0, requested 1/7 (~0.143), limit 1"
	mustDeny(t, createClaim(ctx, gpuClaim(ns, "eighth", mig1g, 1)), eighth)
	p := waitForProfile(t, mig1g, "4 of 7 allocated", func(p *gpuaas.GpuProfile) bool { return p.Status.AllocatedDevices == 4 })
	if p.Status.FreeDevices != 3 {
		t.Errorf("profile status = %+v", p.Status)
	}

	// A restarted controller knows the usage from the API alone.
	rc.stop(t)
	startController(t)
	mustDeny(t, createClaim(ctx, gpuClaim(ns, "eighth", mig1g, 1)), eighth)
	waitForQuota(t, tenant, "still at 1", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "1" && q.Status.ClaimsCounted == 3 })
}

// TestControllerSharedAndTimeSliceWeights: on the demo node's GPU 4 (four
// time-slice replicas) and GPU 5 (a shared GPU whose memory claims
// consume), a replica costs 1/4 unit and a 20Gi share of the 80Gi GPU
// 20/80 = 1/4, charged from the allocation's consumed capacity.
func TestControllerSharedAndTimeSliceWeights(t *testing.T) {
	startNode(t)
	startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "sharing")
	shared, replica, tenant := uniqueName("shared"), uniqueName("replica"), uniqueName("tenant")
	createObject(t, profile(shared, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeShared}))
	createObject(t, profile(replica, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeTimeSlice}))
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")}))
	waitForProfileReady(t, shared)
	waitForProfile(t, replica, "matching 4 replicas", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices == 4 })
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	share := gpuClaim(ns, "share", shared, 1)
	share.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
		Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("20Gi")},
	}
	for _, c := range []*resourceapi.ResourceClaim{share, gpuClaim(ns, "replica", replica, 1)} {
		if err := createClaim(ctx, c); err != nil {
			t.Fatalf("claim %s: %v", c.Name, err)
		}
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, claimPod(ns, c.Name, c.Name, ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		runningPod(t, ctx, ns, c.Name)
	}
	q := waitForQuota(t, tenant, "charged 1/4 + 1/4", func(q *gpuaas.TenantQuota) bool { return usedUnits(q) == "500m" })
	if m := q.Status.Used.GpuMemory.String(); m != "40Gi" {
		t.Errorf("used memory %s, want 40Gi (20Gi share + a 20Gi replica)", m)
	}
}

// TestControllerFirstAvailableOverQuota (issue 12 item 9): a tenant that may
// have no whole GPU asks for "a whole GPU, or else a MIG 1g". The claim
// was always denied, being charged its most expensive alternative; the
// alternatives webhook now drops the whole GPU at creation, and the claim
// is admitted and allocated a 1g. A claim none of whose alternatives fits
// is still denied, whole.
func TestControllerFirstAvailableOverQuota(t *testing.T) {
	node := fakeGPUNode(t, wholeDevice("gpu-0"), migDevice("gpu-1-mig-1g-0", "1g.10gb", 1, "10Gi"))
	startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "alternatives")
	mig1g, whole, tenant := uniqueName("mig-1g"), uniqueName("whole"), uniqueName("tenant")
	createObject(t, profile(mig1g, gpuaas.ProfileSelector{MigProfile: "1g.10gb"}))
	createObject(t, profile(whole, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1"), Devices: map[string]int64{whole: 0}}))
	waitForProfile(t, mig1g, "matching the slice", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices == 1 })
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	firstAvailable := func(name string, classes ...string) *resourceapi.ResourceClaim {
		c := gpuClaim(ns, name, "", 0)
		c.Spec.Devices.Requests[0].Exactly = nil
		for i, class := range classes {
			c.Spec.Devices.Requests[0].FirstAvailable = append(c.Spec.Devices.Requests[0].FirstAvailable, resourceapi.DeviceSubRequest{
				Name: fmt.Sprintf("alt%d", i), DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			})
		}
		// A constraint on the dropped alternative alone must go with it,
		// or the apiserver refuses the trimmed claim.
		c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpu/alt0"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(framework.DriverName + "/productName"))}}
		return c
	}
	mustDeny(t, createClaim(ctx, firstAvailable("whole-only", whole, whole)), `devices of profile "`+whole+`"`, "limit 0")

	if err := createClaim(ctx, firstAvailable("whole-or-1g", whole, mig1g)); err != nil {
		t.Fatalf("a claim the tenant can have a 1g for: %v", err)
	}
	stored, err := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "whole-or-1g", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if alts := stored.Spec.Devices.Requests[0].FirstAvailable; len(alts) != 1 || alts[0].DeviceClassName != mig1g || len(stored.Spec.Devices.Constraints) != 0 {
		t.Fatalf("stored claim %+v: want only the 1g alternative, and no constraint", stored.Spec.Devices)
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "one-1g", "whole-or-1g", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := waitForAllocation(t, ctx, ns, "whole-or-1g")
	if r := c.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Pool != node || r[0].Device != "gpu-1-mig-1g-0" {
		t.Fatalf("allocated %+v, want the 1g", r)
	}
}
